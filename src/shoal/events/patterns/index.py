"""RuleIndex: many rules matched against one event together, through per-path indexes.

Each sub-rule of each rule is one bit. Matching flattens the event once along the paths that
rules use (a trie, so unrelated parts of the event are never visited), asks each present path's
`PathIndex` which sub-rules it satisfies, and knocks out every sub-rule with a path that is
unsatisfied or missing. The work is a dict lookup or two per event value plus a handful of
big-integer operations per path — no Python-level loop over the rules.

Array consistency needs more than per-path answers only when a sub-rule draws two or more of its
fields from paths that lie inside array elements of this event; those few candidates are checked
exactly with `match_subrule`, the same code `Pattern.matches` uses.
"""

from __future__ import annotations

from shoal.events.patterns.flatten import (
    SCALAR_TYPES, SKIP, build_trie, flatten_fields, normalize, resolve_dotted,
)
from shoal.events.patterns.path_index import PathIndex
from shoal.events.patterns.pattern import Pattern, compile_pattern, match_subrule

_CACHE_LIMIT = 4096


class RuleIndex:
    """Rules by id; `match(event)` returns the ids of every rule whose pattern matches.

    Not thread-safe: serialise add and remove with match.
    """

    def __init__(self) -> None:
        self._rules: dict[str, tuple[Pattern, list[int]]] = {}
        self._owner: list = []          # bit -> rule id (None when free)
        self._subrule: list = []        # bit -> sub-rule
        self._free: list[int] = []
        self._leaves: dict[str, dict] = {}   # path -> {bit: Leaf}
        self._dirty: set[str] = set()
        self._paths: dict[str, PathIndex] = {}
        self._trie: dict = {}
        self._all = 0
        self._missing: dict[tuple, int] = {}  # present-path tuple -> sub-rules failed by the rest

    def __len__(self) -> int:
        return len(self._rules)

    def __contains__(self, rule_id) -> bool:
        return rule_id in self._rules

    def add(self, rule_id: str, pattern) -> None:
        """Add a rule, or replace the rule with this id. Raises InvalidEventPattern."""
        if not isinstance(pattern, Pattern):
            pattern = compile_pattern(pattern)
        if rule_id in self._rules:
            self.remove(rule_id)
        bits = []
        for sub in pattern.subrules:
            bit = self._free.pop() if self._free else len(self._owner)
            if bit == len(self._owner):
                self._owner.append(None)
                self._subrule.append(None)
            self._owner[bit] = rule_id
            self._subrule[bit] = sub
            bits.append(bit)
            self._all |= 1 << bit
            for path, leaf in sub:
                self._leaves.setdefault(path, {})[bit] = leaf
                self._dirty.add(path)
        self._rules[rule_id] = (pattern, bits)

    def remove(self, rule_id: str) -> None:
        """Remove a rule. Raises KeyError for an unknown id."""
        _, bits = self._rules.pop(rule_id)
        for bit in bits:
            for path, _ in self._subrule[bit]:
                leaves = self._leaves[path]
                del leaves[bit]
                if not leaves:
                    del self._leaves[path]
                self._dirty.add(path)
            self._owner[bit] = None
            self._subrule[bit] = None
            self._all &= ~(1 << bit)
            self._free.append(bit)

    def _refresh(self) -> None:
        for path in self._dirty:
            leaves = self._leaves.get(path)
            if leaves:
                self._paths[path] = PathIndex(leaves)
            else:
                self._paths.pop(path, None)
        self._dirty.clear()
        # trie entries: [child trie, path, PathIndex]
        self._trie = build_trie(self._paths)
        stack = [self._trie]
        while stack:
            for entry in stack.pop().values():
                entry.append(self._paths.get(entry[1]) if entry[1] is not None else None)
                if entry[0] is not None:
                    stack.append(entry[0])
        self._missing.clear()

    def _scan(self, event: dict):
        """One walk of the event along the rules' paths: (PathIndex -> satisfied bits, the
        PathIndexes that got a value from inside an array element, or None)."""
        satisfied: dict = {}
        in_arrays = None
        stack = [(event, self._trie, False, False)]
        pop, push = stack.pop, stack.append
        while stack:
            container, node, inside, is_list = pop()
            if is_list:
                child, pi = node[0], node[2]
                for v in container:
                    t = type(v)
                    if t is dict:
                        if child is not None:
                            push((v, child, True, False))
                        continue
                    if t is list:
                        push((v, node, True, True))
                        continue
                    if t not in SCALAR_TYPES:
                        v = normalize(v)
                        t = type(v)
                        if t is dict:
                            if child is not None:
                                push((v, child, True, False))
                            continue
                        if t is list:
                            push((v, node, True, True))
                            continue
                        if v is SKIP:
                            continue
                    if pi is not None:
                        bits = pi.on_string(v) if t is str else pi.on_other(v)
                        old = satisfied.get(pi)
                        satisfied[pi] = bits if old is None else old | bits
                        if inside:
                            if in_arrays is None:
                                in_arrays = set()
                            in_arrays.add(pi)
                continue
            for k, v in container.items():
                entry = node.get(k)
                if entry is None:
                    if type(k) is not str or "." not in k:
                        continue
                    entry = resolve_dotted(node, k)
                    if entry is None:
                        continue
                t = type(v)
                if t is dict:
                    if entry[0] is not None:
                        push((v, entry[0], inside, False))
                    continue
                if t is list:
                    push((v, entry, inside, True))
                    continue
                if t not in SCALAR_TYPES:
                    v = normalize(v)
                    t = type(v)
                    if t is dict:
                        if entry[0] is not None:
                            push((v, entry[0], inside, False))
                        continue
                    if t is list:
                        push((v, entry, inside, True))
                        continue
                    if v is SKIP:
                        continue
                pi = entry[2]
                if pi is not None:
                    bits = pi.on_string(v) if t is str else pi.on_other(v)
                    old = satisfied.get(pi)
                    satisfied[pi] = bits if old is None else old | bits
                    if inside:
                        if in_arrays is None:
                            in_arrays = set()
                        in_arrays.add(pi)
        return satisfied, in_arrays

    def match(self, event: dict) -> set[str]:
        """Ids of the rules whose pattern matches the event. Never raises for JSON data."""
        if self._dirty:
            self._refresh()
        if not self._all or not isinstance(event, dict):
            return set()
        satisfied, in_arrays = self._scan(event)

        present = tuple(satisfied)
        fail = self._missing.get(present)
        if fail is None:
            fail = 0
            for index in self._paths.values():
                if index not in satisfied:
                    fail |= index.required
            if len(self._missing) >= _CACHE_LIMIT:
                self._missing.clear()
            self._missing[present] = fail

        exact_check = 0
        if in_arrays is not None and len(in_arrays) > 1:
            # sub-rules with two or more fields inside array elements need array consistency
            once = 0
            for index in in_arrays:
                exact_check |= once & index.all
                once |= index.all
            if exact_check:
                for index in in_arrays:  # absence there is decided by the exact check
                    satisfied[index] |= index.absent & exact_check
        for index, bits in satisfied.items():
            fail |= index.all & ~bits

        matched = self._all & ~fail
        if not matched:
            return set()
        if matched & exact_check:
            fields = flatten_fields(event, self._trie)
            pending = matched & exact_check
            matched &= ~exact_check
            subrule = self._subrule
            while pending:
                low = pending & -pending
                if match_subrule(subrule[low.bit_length() - 1], fields):
                    matched |= low
                pending ^= low
        owner = self._owner
        result = set()
        while matched:
            low = matched & -matched
            result.add(owner[low.bit_length() - 1])
            matched ^= low
        return result
