"""Conformance of shoal's pattern engine with Amazon EventBridge (event-ruler 2.x semantics).

Runs every case of tests/conformance/cases.py against `shoal.events.patterns` directly: a match
case must match, a ``_NEG`` case must not, and an ``_EXC`` case must be rejected with
InvalidEventPattern carrying AWS's recorded message. The same cases can be sent through the
TestEventPattern API by reusing `load_cases()`.
"""

from __future__ import annotations

import filecmp
import json

import pytest

from shoal.events.patterns import InvalidEventPattern, RuleIndex, compile_pattern
from tests.conformance.cases import COPIED, HERE, load_cases, shared_conformance_dir

CASES = load_cases()  # conftest.py prints how many ran and passed, per suite


def _run(case) -> None:
    if case.expected == "invalid":
        with pytest.raises(InvalidEventPattern) as caught:
            compile_pattern(case.pattern_text)
        if case.message is not None:
            assert caught.value.message == case.message
        return
    pattern = compile_pattern(case.pattern_text)
    assert pattern.matches(case.event) is (case.expected == "match")
    # the same answer through the index, alone and among every other valid case's rule
    index = RuleIndex()
    index.add(case.name, case.pattern_text)
    assert (case.name in index.match(case.event)) is (case.expected == "match")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case):
    _run(case)


def test_case_counts():
    localstack = [c for c in CASES if c.suite == "localstack"]
    arrays = [c for c in CASES if c.suite == "event-ruler-arrays"]
    assert len(localstack) == 155 + 1
    assert len(arrays) == 51
    templates = [c for c in localstack if c.name != "complex_multi_key"]
    assert sum(c.expected == "match" for c in templates) == 66
    assert sum(c.expected == "nomatch" for c in templates) == 51
    assert sum(c.expected == "invalid" for c in templates) == 38
    assert all(c.message for c in templates if c.expected == "invalid")  # all 38 have AWS's text
    assert sum(c.expected == "match" for c in arrays) == 33


def test_all_cases_in_one_index():
    """Every valid case's rule in one RuleIndex: each event matches exactly the rules that
    match it one by one (events of other cases included)."""
    valid = [c for c in CASES if c.expected != "invalid"]
    patterns = {c.name: compile_pattern(c.pattern_text) for c in valid}
    index = RuleIndex()
    for name, pattern in patterns.items():
        index.add(name, pattern)
    for case in valid:
        expected = {name for name, p in patterns.items() if p.matches(case.event)}
        assert index.match(case.event) == expected, case.name
        assert (case.name in expected) is (case.expected == "match"), case.name


def test_repo_copy_matches_shared_copy():
    shared = shared_conformance_dir()
    if not shared.is_dir():
        pytest.skip(f"no shared conformance folder at {shared}")
    for folder in COPIED:
        compare = filecmp.dircmp(shared / folder, HERE / folder)
        stack = [compare]
        while stack:
            current = stack.pop()
            assert not current.left_only and not current.right_only, (folder, current.left_only,
                                                                       current.right_only)
            _, mismatch, errors = filecmp.cmpfiles(current.left, current.right,
                                                   current.common_files, shallow=False)
            assert not mismatch and not errors, (folder, mismatch, errors)
            stack.extend(current.subdirs.values())


def test_escape_characters_case():
    """LocalStack's inline (unrecorded) escape case: '*' and a backslash are plain characters."""
    event = json.loads('{"detail": {"escape_star": "*", "escape_backslash": "\\\\"}}')
    pattern = compile_pattern('{"detail": {"escape_star": ["*"], "escape_backslash": ["\\\\"]}}')
    assert pattern.matches(event)


@pytest.mark.parametrize("text, message", [
    ("this is valid json but not a dict",
     "Event pattern is not valid. Reason: Unrecognized token 'this': was expecting (JSON String, "
     "Number, Array, Object or token 'null', 'true' or 'false')"),
    ("{'bad': 'quotation'}",
     "Event pattern is not valid. Reason: Unexpected character (''' (code 39)): was expecting "
     "double-quote to start field name"),
    ('{"not": closed mark"',
     "Event pattern is not valid. Reason: Unrecognized token 'closed': was expecting (JSON String, "
     "Number, Array, Object or token 'null', 'true' or 'false')"),
    ('["not", "a", "dict", "but valid json"]', "Event pattern is not valid. Reason: Filter is not an object"),
])
def test_invalid_json_patterns(text, message):
    """The snapshot's test_invalid_json_event_pattern answers (first line of each message)."""
    with pytest.raises(InvalidEventPattern) as caught:
        compile_pattern(text)
    assert caught.value.message == message
