"""The "Rule is too complex" check for wildcards.

AWS rejects wildcard patterns whose byte machine can be in too many states at once (event-ruler's
MachineComplexityEvaluator counts, over all inputs, the most wildcard-pattern states a traversal
can occupy simultaneously). This module builds the same kind of machine for each field path —
the determinate prefix before the first ``*`` shared between patterns, separate states after it,
each state weighted by the number of distinct patterns passing through it — explores the sets of
states reachable on any input, and rejects the pattern when the largest weighted set exceeds
`LIMIT`. The limit is calibrated on AWS's recorded answers: ``*:*:*:*:*:event-bus/*`` is
rejected, ``/Users/*/dir/dir/dir/dir/dir/doc.txt`` and ``arn:aws:events:us-east-1:*:event-bus/*``
are accepted.
"""

from __future__ import annotations

from shoal.events.patterns.errors import InvalidEventPattern
from shoal.events.patterns.matchers import STAR, wildcard_tokens

LIMIT = 10
MAX_EXPLORED = 20000
TOO_COMPLEX = ("Rule is too complex - try using fewer wildcard characters or fewer repeating "
               "character sequences after a wildcard character")
_ANY = 256
_QUOTE = ord('"')


class _State:
    __slots__ = ("literal", "any", "weight", "prefix", "star")

    def __init__(self):
        self.literal: dict[int, list[int]] = {}
        self.any: list[int] = []
        self.weight: set = set()
        self.prefix: dict[int, int] = {}
        self.star = 0


def _byte_tokens(text: str) -> list[int]:
    tokens, _ = wildcard_tokens(text)
    out = [_QUOTE]
    for token in tokens:
        if token is STAR:
            out.append(_ANY)
        else:
            out.extend(token.encode("utf-8"))
    out.append(_QUOTE)
    return out


def wildcard_complexity(terms: dict) -> int:
    """terms: matcher identity -> list of wildcard texts (several for anything-but lists)."""
    states = [_State()]
    matches: dict = {}
    alphabet: set[int] = set()
    for ident, texts in terms.items():
        for text in texts:
            tokens = _byte_tokens(text)
            current, previous, determinate = 0, -1, True
            for i, token in enumerate(tokens):
                terminal = i == len(tokens) - 1
                was_determinate = determinate
                if terminal:
                    nxt = matches.get(ident, 0)
                elif token == _ANY:
                    nxt = states[current].star if determinate else 0
                    determinate = False
                else:
                    nxt = states[current].prefix.get(token, 0) if determinate else 0
                created = nxt == 0
                if created:
                    nxt = len(states)
                    states.append(_State())
                    if terminal:
                        matches[ident] = nxt
                    elif token == _ANY:
                        if was_determinate:
                            states[current].star = nxt
                    elif determinate:
                        states[current].prefix[token] = nxt
                if token == _ANY:
                    if not states[nxt].any:
                        states[current].any.append(nxt)
                        states[nxt].any = [nxt]
                elif terminal or created:
                    alphabet.add(token)
                    states[current].literal.setdefault(token, []).append(nxt)
                    if i > 0 and tokens[i - 1] == _ANY:  # the wildcard may match nothing
                        states[previous].literal.setdefault(token, []).append(nxt)
                states[nxt].weight.add(ident)
                previous, current = current, nxt
    if len(states) == 1:
        return 0
    symbols = [_ANY, *alphabet]  # _ANY stands for every byte without its own transition
    start = frozenset([0])
    seen = {start}
    pending = [start]
    maximum = 0
    while pending:
        active = pending.pop()
        for symbol in symbols:
            nxt: set[int] = set()
            for sid in active:
                state = states[sid]
                nxt.update(state.any)
                if symbol != _ANY:
                    nxt.update(state.literal.get(symbol, ()))
            if not nxt:
                continue
            weight = 0
            for sid in nxt:
                weight += len(states[sid].weight)
                for target in states[sid].any:
                    if target not in nxt:
                        weight += len(states[target].weight)
            if weight > LIMIT:
                return weight
            maximum = max(maximum, weight)
            key = frozenset(nxt)
            if key not in seen:
                if len(seen) >= MAX_EXPLORED:
                    return LIMIT + 1
                seen.add(key)
                pending.append(key)
    return maximum


def check_wildcard_complexity(subrules) -> None:
    """Raise InvalidEventPattern when the wildcards on any one field path are too complex.

    All wildcards a pattern applies to one path are evaluated together (event-ruler evaluates the
    machine per name state, which for patterns without $or is the same thing).
    """
    by_path: dict[str, dict] = {}
    for sub in subrules:
        for path, leaf in sub:
            for matcher in leaf.matchers:
                if matcher.kind == "wildcard":
                    by_path.setdefault(path, {})[matcher.ident] = [matcher.text]
                elif matcher.kind == "anything-but-wildcard":
                    by_path.setdefault(path, {})[matcher.ident] = list(matcher.texts)
    for terms in by_path.values():
        if wildcard_complexity(terms) > LIMIT:
            raise InvalidEventPattern(TOO_COMPLEX)
