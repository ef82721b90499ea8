"""Turning an event into (path, value) leaves, guided by the paths that patterns use.

Paths are the dotted field names of event-ruler: ``{"detail": {"state": "x"}}`` has the leaf
``detail.state``, and so does ``{"detail": {"state.x": ...}}``'s key split on its dots (the
dot-joining quirk). Arrays are "crushed": their elements are values of the parent path. Only
scalars are leaves: objects, and empty arrays, produce no leaf. Every object or array that is an
element of an array gets an array membership ``(array id, index)``, which its leaves inherit;
array-consistent matching compares these. Walks are iterative, so deep events cannot exhaust the
stack, and anything that is not JSON data is skipped rather than raising.
"""

from __future__ import annotations

SCALAR_TYPES = frozenset([str, int, float, bool, type(None)])
SKIP = object()


def build_trie(paths) -> dict:
    """step -> [child trie or None, full path if a pattern names this path as a leaf, or None].

    (The index appends its PathIndex to each entry; walkers read only the first two items.)
    """
    root: dict = {}
    for path in paths:
        steps = path.split(".")
        node = root
        for i, step in enumerate(steps):
            entry = node.get(step)
            if entry is None:
                entry = node[step] = [None, None]
            if i == len(steps) - 1:
                entry[1] = path
            else:
                if entry[0] is None:
                    entry[0] = {}
                node = entry[0]
    return root


def resolve_dotted(node: dict, key: str):
    steps = key.split(".")
    for step in steps[:-1]:
        entry = node.get(step)
        if entry is None or entry[0] is None:
            return None
        node = entry[0]
    return node.get(steps[-1])


def _lookup(node: dict, key):
    entry = node.get(key)
    if entry is None and type(key) is str and "." in key:
        entry = resolve_dotted(node, key)
    return entry


def normalize(v):
    """Plain JSON types for subclasses (IntEnum, str enums, OrderedDict...); SKIP for the rest."""
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, dict):
        return dict(v)
    if isinstance(v, (list, tuple)):
        return list(v)
    return SKIP


def flatten_fields(event: dict, root: dict) -> dict:
    """path -> [(value, membership)], membership a tuple of (array id, index) pairs."""
    out: dict = {}
    next_array = 0
    stack = [(event, root, (), False)]
    pop, push = stack.pop, stack.append
    while stack:
        container, node, membership, is_list = pop()
        if is_list:
            array_id = next_array
            next_array += 1
            child, path = node[0], node[1]
            for index, v in enumerate(container):
                t = type(v)
                if t not in SCALAR_TYPES and t is not dict and t is not list:
                    v = normalize(v)
                    if v is SKIP:
                        continue
                    t = type(v)
                if t is dict:
                    if child is not None:
                        push((v, child, membership + ((array_id, index),), False))
                elif t is list:
                    push((v, node, membership + ((array_id, index),), True))
                elif path is not None:
                    out.setdefault(path, []).append((v, membership))
            continue
        for k, v in container.items():
            entry = _lookup(node, k)
            if entry is None:
                continue
            t = type(v)
            if t not in SCALAR_TYPES and t is not dict and t is not list:
                v = normalize(v)
                if v is SKIP:
                    continue
                t = type(v)
            if t is dict:
                if entry[0] is not None:
                    push((v, entry[0], membership, False))
            elif t is list:
                push((v, entry, membership, True))
            elif entry[1] is not None:
                out.setdefault(entry[1], []).append((v, membership))
    return out
