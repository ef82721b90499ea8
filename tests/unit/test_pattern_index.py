"""Property tests: RuleIndex answers exactly what the rules' own Pattern.matches answer, and
matching never raises, whatever the (JSON) event.

Patterns are drawn from the whole language over a small vocabulary of keys and values, so that
rules and events collide often: literals of every JSON type (True next to 1, 300 next to 300.0),
every operator, exists true/false, $or, dotted keys; events nest objects and arrays (arrays of
objects included, for array consistency) over the same keys.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, note, settings, target
from hypothesis import strategies as st

from shoal.events.patterns import InvalidEventPattern, RuleIndex, compile_pattern

KEYS = ["a", "b", "c", "b.c"]
STRINGS = ["x", "y", "X", "xy", "", "10.0.0.1", "10.0.0.77", "::1", "1", "straße", "STRASSE"]
NUMBERS = [0, 1, -1, 1.0, 2.5, 300, 3e2, 2**70, 9007199254740993]
SCALARS = st.sampled_from(STRINGS) | st.sampled_from(NUMBERS) | st.sampled_from([True, False, None])

OPERATORS = st.one_of(
    st.sampled_from(["", "x", "X", "1"]).map(lambda s: {"prefix": s}),
    st.sampled_from(["x", "X"]).map(lambda s: {"prefix": {"equals-ignore-case": s}}),
    st.sampled_from(["", "y", "1"]).map(lambda s: {"suffix": s}),
    st.sampled_from(["Y", "sse"]).map(lambda s: {"suffix": {"equals-ignore-case": s}}),
    st.sampled_from(["x", "", "strasse"]).map(lambda s: {"equals-ignore-case": s}),
    st.sampled_from(["x*", "*y", "*", "", "x*y", "\\*", "1*", "*.*"]).map(lambda s: {"wildcard": s}),
    st.sampled_from(["x", 1, ["x", "y"], [1, 300], [0], ""]).map(lambda v: {"anything-but": v}),
    st.sampled_from(["x", ["x", "1"]]).map(lambda v: {"anything-but": {"prefix": v}}),
    st.sampled_from(["y", ["y", "e"]]).map(lambda v: {"anything-but": {"suffix": v}}),
    st.sampled_from(["X", ["x", "straße"]]).map(lambda v: {"anything-but": {"equals-ignore-case": v}}),
    st.sampled_from(["x*", ["*y", ""]]).map(lambda v: {"anything-but": {"wildcard": v}}),
    st.sampled_from([[">", 0], ["<", 2], [">=", 1, "<", 300], ["=", 1], [">", -1, "<=", 1],
                     ["<=", 2.5], [">", 1e300]]).map(lambda v: {"numeric": v}),
    st.booleans().map(lambda b: {"exists": b}),
    st.sampled_from(["10.0.0.0/24", "10.0.0.64/26", "::/1"]).map(lambda c: {"cidr": c}),
)
LEAVES = st.lists(SCALARS | OPERATORS, min_size=1, max_size=3)


def _objects(values):
    plain = st.dictionaries(st.sampled_from(KEYS), values, min_size=1, max_size=3)
    branch = st.dictionaries(st.sampled_from(KEYS), LEAVES | _NESTED_LEAVES, min_size=1, max_size=2)
    with_or = st.tuples(plain, st.lists(branch, min_size=2, max_size=3)).map(
        lambda t: {**t[0], "$or": t[1]})
    return plain | with_or


_NESTED_LEAVES = st.dictionaries(st.sampled_from(KEYS), LEAVES, min_size=1, max_size=2)
PATTERNS = _objects(LEAVES | _objects(LEAVES | _objects(LEAVES)))  # objects nest up to 3 deep

EVENT_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS + ["z"]), children, max_size=3),
    max_leaves=10)
EVENTS = st.dictionaries(st.sampled_from(KEYS + ["z"]), EVENT_VALUES, max_size=4)


def _compiled(patterns):
    out = {}
    for n, pattern in enumerate(patterns):
        try:
            out[f"r{n}"] = compile_pattern(pattern)
        except InvalidEventPattern:
            pass  # e.g. a "$or" branch named like an operator; the compiler's own business
    return out


@settings(max_examples=150, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns=st.lists(PATTERNS, min_size=1, max_size=8), events=st.lists(EVENTS, min_size=1, max_size=6),
       data=st.data())
def test_index_matches_each_rule_alone(patterns, events, data):
    rules = _compiled(patterns)
    index = RuleIndex()
    for rule_id, pattern in rules.items():
        index.add(rule_id, pattern)
    total = 0
    for event in events:
        expected = {rule_id for rule_id, pattern in rules.items() if pattern.matches(event)}
        note(f"event={json.dumps(event)} expected={sorted(expected)}")
        assert index.match(event) == expected
        total += len(expected)
    target(float(total), label="rule matches")

    # removing and replacing rules keeps the index exact
    removed = data.draw(st.sets(st.sampled_from(sorted(rules))) if rules else st.just(set()))
    for rule_id in removed:
        index.remove(rule_id)
        del rules[rule_id]
    if rules:
        replaced = data.draw(st.sampled_from(sorted(rules)))
        new = _compiled([data.draw(PATTERNS)]).get("r0")
        if new is not None:
            index.add(replaced, new)
            rules[replaced] = new
    for event in events:
        assert index.match(event) == {rule_id for rule_id, p in rules.items() if p.matches(event)}


ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    | st.sampled_from(STRINGS + NUMBERS),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(alphabet="abc.$", max_size=4) | st.sampled_from(KEYS), children, max_size=4),
    max_leaves=25)


@settings(max_examples=120, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns=st.lists(PATTERNS, min_size=1, max_size=5), events=st.lists(ANY_JSON, min_size=1, max_size=5))
def test_matching_never_raises(patterns, events):
    rules = _compiled(patterns)
    index = RuleIndex()
    for rule_id, pattern in rules.items():
        index.add(rule_id, pattern)
    for event in events:
        found = index.match(event)
        assert isinstance(found, set)
        for rule_id, pattern in rules.items():
            assert pattern.matches(event) is (rule_id in found)


@settings(max_examples=60, database=None, deadline=None)
@given(values=st.lists(st.text(alphabet="ab/:-*", max_size=12), min_size=1, max_size=20),
       wildcards=st.lists(st.text(alphabet="ab/:-*", min_size=1, max_size=8), min_size=20, max_size=40))
def test_many_wildcards_on_one_path(wildcards, values):
    """Past 16 wildcards on a path the index finds candidates through 3-grams; same answers."""
    rules = _compiled([{"k": [{"wildcard": w}]} for w in wildcards])
    index = RuleIndex()
    for rule_id, pattern in rules.items():
        index.add(rule_id, pattern)
    for value in values:
        event = {"k": value}
        assert index.match(event) == {r for r, p in rules.items() if p.matches(event)}
