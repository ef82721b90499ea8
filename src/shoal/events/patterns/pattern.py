"""A compiled pattern, and array-consistent matching of one sub-rule against an event."""

from __future__ import annotations

from shoal.events.patterns.compiler import compile_tree
from shoal.events.patterns.flatten import build_trie, flatten_fields
from shoal.events.patterns.parse import from_python, load_text


def _merge(a: tuple, b: tuple):
    """Union of two array memberships, or None when they put one array at two indexes."""
    if not b:
        return a
    if not a:
        return b
    merged = dict(a)
    for array_id, index in b:
        seen = merged.setdefault(array_id, index)
        if seen != index:
            return None
    return tuple(sorted(merged.items()))


def match_subrule(sub: tuple, fields: dict) -> bool:
    """event-ruler's array-consistent matching (ACFinder) of one sub-rule.

    Fields are taken in the sub-rule's sorted key order. Each value key picks one event leaf that
    its leaf accepts, and all picked leaves must be array-consistent (no two from different
    elements of one array). An ``exists: false`` key holds when no leaf of its path is consistent
    with the leaves picked so far.
    """
    candidates = []
    any_membership = False
    for path, leaf in sub:
        present = fields.get(path, ())
        accepted = list(dict.fromkeys(m for v, m in present if leaf.test(v)))
        if not accepted and not leaf.allow_absent:
            return False
        memberships = list(dict.fromkeys(m for _, m in present))
        any_membership = any_membership or any(memberships)
        candidates.append((accepted, leaf.allow_absent, memberships))
    if not any_membership:
        for accepted, allow_absent, present in candidates:
            if not accepted and not (allow_absent and not present):
                return False
        return True
    # Only arrays that later keys' leaves belong to can still matter: failures are remembered
    # under the membership narrowed to those, so independent arrays cannot multiply the work.
    later: list[set] = [set() for _ in range(len(candidates) + 1)]
    for i in range(len(candidates) - 1, -1, -1):
        later[i] = later[i + 1] | {array_id for m in candidates[i][2] for array_id, _ in m}
    failed: set = set()

    def search(i: int, membership: tuple) -> bool:
        if i == len(candidates):
            return True
        key = (i, tuple(pair for pair in membership if pair[0] in later[i]))
        if key in failed:
            return False
        accepted, allow_absent, present = candidates[i]
        for m in accepted:
            merged = _merge(membership, m)
            if merged is not None and search(i + 1, merged):
                return True
        if allow_absent and all(_merge(membership, m) is None for m in present):
            if search(i + 1, membership):
                return True
        failed.add(key)
        return False

    return search(0, ())


class Pattern:
    """A validated, compiled event pattern. Build one with `compile_pattern`."""

    __slots__ = ("subrules", "paths", "_trie")

    def __init__(self, subrules):
        self.subrules = tuple(subrules)
        self.paths = frozenset(path for sub in self.subrules for path, _ in sub)
        self._trie = build_trie(self.paths)

    def matches(self, event: dict) -> bool:
        """True when the event matches. Never raises; anything but a JSON object is no match."""
        if not isinstance(event, dict):
            return False
        fields = flatten_fields(event, self._trie)
        for sub in self.subrules:
            if match_subrule(sub, fields):
                return True
        return False

    def __repr__(self) -> str:
        return f"Pattern({[dict(sub) for sub in self.subrules]!r})"


def compile_pattern(pattern) -> Pattern:
    """Validate a pattern (JSON text, UTF-8 bytes or a Python dict) and compile it once.

    JSON text is read with duplicate keys preserved, as AWS reads it: a repeated leaf path keeps
    its last value. Raises InvalidEventPattern with AWS's wording.
    """
    if isinstance(pattern, (str, bytes, bytearray)):
        tree = load_text(pattern)
    else:
        tree = from_python(pattern)
    return Pattern(compile_tree(tree))
