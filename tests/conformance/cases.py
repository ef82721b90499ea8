"""The EventBridge pattern conformance cases, as plain data that any runner can use.

    load_cases() -> list[Case]

Two suites live next to this file, copied unchanged from /work/shared/conformance (see each
folder's NOTICE for origin and license):

* ``eventbridge/``: LocalStack's 155 cases recorded against the real AWS TestEventPattern API
  (66 match, 51 ``_NEG`` no-match, 38 ``_EXC`` invalid with AWS's message in the snapshot), plus
  the duplicate-key case, whose pattern must be passed as raw text;
* ``eventbridge-arrays/``: event-ruler's 51 array-consistency cases with derived expectations.
  Their events have no envelope fields (``id``, ``source``...), so a runner that goes through the
  TestEventPattern API must add them (the top-level names do not clash with the cases' fields).

The ``.json5`` files use two JSON5 features only, ``//`` comments and trailing commas, which
`json5_loads` strips (strings are respected, so ``"https://..."`` survives).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCALSTACK = HERE / "eventbridge"
ARRAYS = HERE / "eventbridge-arrays"
SNAPSHOT_KEY = "tests/aws/services/events/test_events_patterns.py::TestEventPattern::test_event_pattern[{}]"
# the files of the shared copy this folder must equal
COPIED = ("eventbridge", "eventbridge-arrays")


@dataclass(frozen=True)
class Case:
    name: str
    pattern_text: str          # JSON text of the pattern, exactly what to send to the API
    event: dict
    expected: str              # "match" | "nomatch" | "invalid"
    message: str | None = None  # AWS's message (first line) for "invalid", when recorded
    suite: str = "localstack"   # "localstack" | "event-ruler-arrays"


def json5_loads(text: str):
    """json.loads for the JSON5 subset of the case files: // comments and trailing commas."""
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        ch = text[i]
        if in_string:
            out.append(ch)
            if ch == "\\":
                out.append(text[i + 1])
                i += 2
                continue
            if ch == '"':
                in_string = False
            i += 1
            continue
        if ch == '"':
            in_string = True
        elif ch == "/" and text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        elif ch == ",":
            j = i + 1
            while j < n:  # a comma followed (past blanks and comments) by a closer is trailing
                if text[j].isspace():
                    j += 1
                elif text.startswith("//", j):
                    while j < n and text[j] != "\n":
                        j += 1
                else:
                    break
            if j < n and text[j] in "}]":
                i += 1
                continue
        out.append(ch)
        i += 1
    return json.loads("".join(out))


def _localstack_cases() -> list[Case]:
    snapshot = json.loads((LOCALSTACK / "test_events_patterns.snapshot.json").read_text())
    cases = []
    for path in sorted((LOCALSTACK / "event_pattern_templates").glob("*.json5")):
        label = path.stem
        data = json5_loads(path.read_text(encoding="utf-8"))
        pattern_text = json.dumps(data["EventPattern"])
        message = None
        if label.endswith("_EXC"):
            expected = "invalid"
            recorded = snapshot.get(SNAPSHOT_KEY.format(label), {}).get("recorded-content", {})
            error = recorded.get(label, {}).get("exception_message", {}).get("Error")
            if error:
                message = error["Message"]
        elif label.endswith("_NEG"):
            expected = "nomatch"
        else:
            expected = "match"
        cases.append(Case(label, pattern_text, data["Event"], expected, message))
    templates = LOCALSTACK / "event_pattern_templates"
    cases.append(Case(
        "complex_multi_key",  # a duplicate key: the raw text is the pattern
        (templates / "complex_multi_key_event_pattern.json").read_text(encoding="utf-8"),
        json.loads((templates / "complex_multi_key_event.json").read_text(encoding="utf-8")),
        "match"))
    return cases


def _array_cases() -> list[Case]:
    raw = json.loads((ARRAYS / "correctness-cases.json").read_text(encoding="utf-8"))
    expected = {e["index"]: e["matches"] for e in
                json.loads((ARRAYS / "expected-results.json").read_text(encoding="utf-8"))}
    return [Case(f"{index:02d} {case['name']}", json.dumps(case["rule"]), case["event"],
                 "match" if expected[index] else "nomatch", suite="event-ruler-arrays")
            for index, case in enumerate(raw)]


def load_cases() -> list[Case]:
    """Every conformance case: 155 + 1 LocalStack (AWS-checked), then 51 array-consistency."""
    return _localstack_cases() + _array_cases()


def shared_conformance_dir(repo_root: Path | None = None) -> Path:
    """Where the project's shared copy lives: <repo parent>/shared/conformance."""
    root = repo_root or HERE.parent.parent
    return Path(root).parent / "shared" / "conformance"
