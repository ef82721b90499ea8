"""What EventBridge sends to a target: `Input`, `InputPath` and `InputTransformer`.

`render(event, target)` turns a matched event into the bytes a target receives, with the
semantics of Amazon EventBridge (eb-transform-target-input, the PutTargets API reference, and
the AWS-recorded results in LocalStack's
`tests/aws/services/events/test_events_inputs.snapshot.json`):

* none of the three: the whole event, as minified JSON;
* `Input`: the constant text, byte for byte;
* `InputPath`: the JSON value the path selects, as minified JSON (a string comes out quoted:
  `$.detail.state` gives `"RUNNING"`). A path that selects nothing gives `null` (AWS does not
  document this case; shoal's decision);
* `InputTransformer`: each `<name>` in `InputTemplate` is replaced by the value that
  `InputPathsMap[name]` selects, or by a predefined variable:
  - if the template is JSON once its placeholders are filled (an object, an array, or a quoted
    string such as `"instance <instance> is in <state>"`), a placeholder *inside* a JSON string
    inserts the value's raw text (a string as is, not escaped: AWS does not escape extracted
    values either), and one *outside* a string inserts the JSON value (`"RUNNING"` with its
    quotes, `5`, `{"a":1}`). The result is minified, as AWS minifies the JSON it passes;
  - any other template (`Instance <instance> is <state>`) is plain text, and every placeholder
    inserts the raw text;
  - a path that selects nothing inserts the empty string: `""` outside quotes, nothing inside
    (AWS-recorded: `{"command": <command>}` with a missing path delivers `{"command":""}`);
  - predefined variables: `aws.events.rule-name`, `aws.events.rule-arn`,
    `aws.events.event.ingestion-time` (the event's `time` unless the caller passes the time
    shoal received it), `aws.events.event.json` (the whole event), and `aws.events.event`,
    which, as AWS records it, is the envelope *without* `detail` and with `detail-type` spelt
    `detailType`. Use `aws.events.event.json` for the whole event.

JSONPath is EventBridge's subset: `$`, `.name`, `['name']` (InputPath only: InputPathsMap values
must use dot notation), `[n]`, and the wildcards `.*` and `[*]`, which select a list of every
match. Recursive descent (`..`), filters, slices and negative indices are rejected.

`validate_target(target)` applies PutTargets' rules and raises `ValueError` with a message that
names the field, e.g. `Targets[0].InputTransformer.InputTemplate: contains invalid placeholder
<cmd>; ...`. It also checks the target `Arn` and `DeadLetterConfig.Arn` with
`shoal.events.targets.parse_target`, and `RetryPolicy`'s ranges.
"""

from __future__ import annotations

import json
import re
from typing import Any

from shoal.events.targets import parse_target

MAX_PATHS = 100  # InputPathsMap entries (TransformerPaths, max 100)
MAX_PATH_LEN = 256  # TargetInputPath
MAX_TEXT_LEN = 8192  # TargetInput and TransformerInput
MAX_RETRY_ATTEMPTS = 185
EVENT_AGE_RANGE = (60, 86400)

PREDEFINED = (
    "aws.events.rule-arn",
    "aws.events.rule-name",
    "aws.events.event",
    "aws.events.event.ingestion-time",
    "aws.events.event.json",
)

_PLACEHOLDER = re.compile(r"<([^<>]+)>")
_KEY = re.compile(r"[A-Za-z0-9_\-]{1,256}")
_TARGET_ID = re.compile(r"[.\-_A-Za-z0-9]{1,64}")
_NAME_CHAR = re.compile(r"[^.\[\]'\"*\s]")
_MISSING = object()
_WILD = object()
_COMPACT = {"separators": (",", ":"), "ensure_ascii": False}


def dumps(value: Any) -> str:
    """Minified JSON, non-ASCII kept as is: what EventBridge passes to targets."""
    return json.dumps(value, **_COMPACT)


# --- JSONPath ----------------------------------------------------------------------------------


def parse_path(path: str, *, dot_only: bool = False) -> tuple:
    """Parse a JSONPath of EventBridge's subset into segments: str (key), int (index), or a
    wildcard. Raises ValueError naming the position of the first problem."""
    if not isinstance(path, str) or not path.startswith("$"):
        raise ValueError(f"{path!r} is not a JSONPath: it must start with '$'")
    segments: list = []
    i, n = 1, len(path)
    while i < n:
        ch = path[i]
        if ch == ".":
            if path.startswith("..", i):
                raise ValueError(f"{path!r}: recursive descent '..' is not supported")
            if path.startswith(".*", i):
                segments.append(_WILD)
                i += 2
                continue
            j = i + 1
            while j < n and _NAME_CHAR.match(path[j]):
                j += 1
            if j == i + 1:
                raise ValueError(f"{path!r}: expected a field name at position {i + 1}")
            segments.append(path[i + 1:j])
            i = j
        elif ch == "[":
            close = path.find("]", i)
            if close < 0:
                raise ValueError(f"{path!r}: '[' at position {i} is not closed")
            inner = path[i + 1:close]
            if inner == "*":
                segments.append(_WILD)
            elif inner.isdigit() and inner.isascii():
                segments.append(int(inner))
            elif len(inner) >= 3 and inner[0] == inner[-1] and inner[0] in "'\"":
                if dot_only:
                    raise ValueError(f"{path!r}: use dot notation ($.a.b), not bracket notation")
                segments.append(inner[1:-1])
            else:
                raise ValueError(f"{path!r}: unsupported selector [{inner}] (use [n], [*] "
                                 f"or ['name'])")
            i = close + 1
        else:
            raise ValueError(f"{path!r}: unexpected {ch!r} at position {i}")
    return tuple(segments)


def select(doc: Any, path: str) -> Any:
    """The value `path` selects in `doc`; `_MISSING` if none. A path with a wildcard gives the
    list of all matches (possibly empty), as Jayway JSONPath does."""
    segments = parse_path(path)
    if not any(s is _WILD for s in segments):
        current = doc
        for seg in segments:
            current = _step(current, seg)
            if current is _MISSING:
                return _MISSING
        return current
    matches = [doc]
    for seg in segments:
        nxt = []
        for m in matches:
            if seg is _WILD:
                nxt.extend(m.values() if isinstance(m, dict) else m if isinstance(m, list) else ())
            else:
                value = _step(m, seg)
                if value is not _MISSING:
                    nxt.append(value)
        matches = nxt
    return matches


def _step(current: Any, seg: Any) -> Any:
    if isinstance(seg, int):
        return current[seg] if isinstance(current, list) and seg < len(current) else _MISSING
    return current[seg] if isinstance(current, dict) and seg in current else _MISSING


# --- templates ---------------------------------------------------------------------------------


def _pieces(template: str) -> list[tuple[str, str | None, bool]]:
    """Split a template into (literal, placeholder name or None, inside a JSON string?)."""
    out: list[tuple[str, str | None, bool]] = []
    in_str = False
    start = i = 0
    while i < len(template):
        ch = template[i]
        if ch == "<" and (m := _PLACEHOLDER.match(template, i)):
            out.append((template[start:i], m.group(1), in_str))
            start = i = m.end()
            continue
        if in_str and ch == "\\":
            i += 2
            continue
        if ch == '"':
            in_str = not in_str
        i += 1
    out.append((template[start:], None, in_str))
    return out


def _json_probe(pieces: list[tuple[str, str | None, bool]]) -> Any:
    """Parse the template with placeholders outside strings standing in as `0` (those inside
    strings stay as text). Returns the parsed value or `_MISSING` if it is not JSON. Object keys
    that hold a placeholder raise ValueError (AWS: a placeholder cannot be an object key)."""
    text = "".join(lit + ("" if name is None else f"<{name}>" if inside else "0")
                   for lit, name, inside in pieces)

    def pairs(items):
        for key, _ in items:
            if _PLACEHOLDER.search(key):
                raise ValueError(f"a placeholder cannot be used as an object key ({key!r})")
        return dict(items)

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError:
        return _MISSING


def minify(text: str) -> str:
    """Drop whitespace outside JSON strings, keeping everything else (number spellings, escapes)
    byte for byte. Only meaningful for text that is valid JSON."""
    out: list[str] = []
    in_str = escaped = False
    for ch in text:
        if in_str:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch in " \t\r\n":
            continue
        else:
            out.append(ch)
            in_str = ch == '"'
    return "".join(out)


def _predefined(event: dict, rule_name: str, rule_arn: str, ingestion_time: str | None) -> dict:
    return {
        "aws.events.rule-name": rule_name,
        "aws.events.rule-arn": rule_arn,
        "aws.events.event.ingestion-time": ingestion_time or event.get("time", ""),
        "aws.events.event.json": event,
        # As AWS delivers it (recorded in LocalStack's AWS-validated snapshot): no `detail`,
        # and `detail-type` spelt `detailType`.
        "aws.events.event": {("detailType" if k == "detail-type" else k): v
                             for k, v in event.items() if k != "detail"},
    }


def _raw(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def transform(event: dict, transformer: dict, *, rule_name: str = "", rule_arn: str = "",
              ingestion_time: str | None = None) -> str:
    """Fill an InputTransformer's template from `event` (see the module docstring)."""
    template = transformer["InputTemplate"]
    paths = transformer.get("InputPathsMap") or {}
    values = _predefined(event, rule_name, rule_arn, ingestion_time)
    for name, path in paths.items():
        if name not in values:
            values[name] = select(event, path)
    pieces = _pieces(template)
    try:
        is_json = _json_probe(pieces) is not _MISSING
    except ValueError:
        is_json = False
    parts: list[str] = []
    for literal, name, inside in pieces:
        parts.append(literal)
        if name is None:
            continue
        value = values.get(name, _MISSING)
        if not is_json or inside:
            parts.append("" if value is _MISSING else _raw(value))
        else:
            parts.append('""' if value is _MISSING else dumps(value))
    text = "".join(parts)
    if is_json:
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return text  # an unescaped value broke the JSON: AWS passes it on as is, so do we
        return minify(text)
    return text


def render(event: dict, target: dict, *, rule_name: str = "", rule_arn: str = "",
           ingestion_time: str | None = None) -> bytes:
    """The bytes EventBridge would send to `target` for `event` (UTF-8)."""
    given = [k for k in ("Input", "InputPath", "InputTransformer") if target.get(k) is not None]
    if len(given) > 1:
        raise ValueError(f"only one of Input, InputPath or InputTransformer may be given, "
                         f"got {', '.join(given)}")
    if not given:
        return dumps(event).encode()
    if given[0] == "Input":
        return target["Input"].encode()
    if given[0] == "InputPath":
        value = select(event, target["InputPath"])
        return b"null" if value is _MISSING else dumps(value).encode()
    return transform(event, target["InputTransformer"], rule_name=rule_name, rule_arn=rule_arn,
                     ingestion_time=ingestion_time).encode()


# --- validation --------------------------------------------------------------------------------


def validate_target(target: dict, *, index: int = 0) -> None:
    """Check one PutTargets entry; raise ValueError naming the field (`Targets[<index>]...`)."""
    p = f"Targets[{index}]"
    if not isinstance(target, dict):
        raise ValueError(f"{p}: must be an object")
    tid = target.get("Id")
    if not isinstance(tid, str) or not _TARGET_ID.fullmatch(tid):
        raise ValueError(f"{p}.Id: must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '-', '_'")
    arn = target.get("Arn")
    if not isinstance(arn, str) or not arn:
        raise ValueError(f"{p}.Arn: is required")
    try:
        parse_target(arn)
    except ValueError as e:
        raise ValueError(f"{p}.Arn: {e}") from None

    given = [k for k in ("Input", "InputPath", "InputTransformer") if target.get(k) is not None]
    if len(given) > 1:
        raise ValueError(f"{p}: only one of Input, InputPath or InputTransformer may be given "
                         f"(got {' and '.join(given)})")
    if "Input" in given:
        _check_input(target["Input"], f"{p}.Input")
    if "InputPath" in given:
        _check_path(target["InputPath"], f"{p}.InputPath", dot_only=False)
    if "InputTransformer" in given:
        _check_transformer(target["InputTransformer"], f"{p}.InputTransformer")
    if target.get("RetryPolicy") is not None:
        _check_retry(target["RetryPolicy"], f"{p}.RetryPolicy")
    if target.get("DeadLetterConfig") is not None:
        dlc = target["DeadLetterConfig"]
        dlq = dlc.get("Arn") if isinstance(dlc, dict) else None
        if not isinstance(dlq, str) or not dlq:
            raise ValueError(f"{p}.DeadLetterConfig.Arn: is required")
        try:
            parse_target(dlq)
        except ValueError as e:
            raise ValueError(f"{p}.DeadLetterConfig.Arn: {e}") from None


def _check_input(text: Any, field: str) -> None:
    if not isinstance(text, str):
        raise ValueError(f"{field}: must be a string of JSON text")
    if len(text) > MAX_TEXT_LEN:
        raise ValueError(f"{field}: at most {MAX_TEXT_LEN} characters, got {len(text)}")
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{field}: is not valid JSON ({e.msg} at position {e.pos})") from None


def _check_path(path: Any, field: str, *, dot_only: bool) -> None:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{field}: must be a non-empty JSONPath string")
    if len(path) > MAX_PATH_LEN:
        raise ValueError(f"{field}: at most {MAX_PATH_LEN} characters, got {len(path)}")
    try:
        parse_path(path, dot_only=dot_only)
    except ValueError as e:
        raise ValueError(f"{field}: {e}") from None


def _check_transformer(tr: Any, field: str) -> None:
    if not isinstance(tr, dict):
        raise ValueError(f"{field}: must be an object")
    paths = tr.get("InputPathsMap")
    if paths is None:
        paths = {}
    if not isinstance(paths, dict):
        raise ValueError(f"{field}.InputPathsMap: must be an object of name to JSONPath")
    if len(paths) > MAX_PATHS:
        raise ValueError(f"{field}.InputPathsMap: at most {MAX_PATHS} entries, got {len(paths)}")
    for key, path in paths.items():
        if not isinstance(key, str) or key.lower().startswith("aws.") or key in PREDEFINED:
            raise ValueError(f"{field}.InputPathsMap: {key!r} is reserved (names starting with "
                             f"'aws.' belong to the predefined variables)")
        if not _KEY.fullmatch(key):
            raise ValueError(f"{field}.InputPathsMap: {key!r} must be 1 to 256 characters of "
                             f"A-Z, a-z, 0-9, '_', '-'")
        _check_path(path, f"{field}.InputPathsMap.{key}", dot_only=True)
    template = tr.get("InputTemplate")
    tfield = f"{field}.InputTemplate"
    if not isinstance(template, str) or not template:
        raise ValueError(f"{tfield}: is required (1 to {MAX_TEXT_LEN} characters)")
    if len(template) > MAX_TEXT_LEN:
        raise ValueError(f"{tfield}: at most {MAX_TEXT_LEN} characters, got {len(template)}")
    pieces = _pieces(template)
    for _, name, _ in pieces:
        if name is not None and name not in paths and name not in PREDEFINED:
            raise ValueError(f"{tfield}: contains invalid placeholder <{name}>; define it in "
                             f"InputPathsMap or use one of {', '.join(PREDEFINED)}")
    try:
        parsed = _json_probe(pieces)
    except ValueError as e:
        raise ValueError(f"{tfield}: {e}") from None
    if parsed is _MISSING and template.strip()[:1] in ("{", "["):
        raise ValueError(f"{tfield}: looks like JSON but is not valid JSON once its placeholders "
                         f"are filled (a placeholder cannot be an object key)")


def _check_retry(policy: Any, field: str) -> None:
    if not isinstance(policy, dict):
        raise ValueError(f"{field}: must be an object")
    attempts = policy.get("MaximumRetryAttempts")
    if attempts is not None and (type(attempts) is not int
                                 or not 0 <= attempts <= MAX_RETRY_ATTEMPTS):
        raise ValueError(f"{field}.MaximumRetryAttempts: must be an integer from 0 to "
                         f"{MAX_RETRY_ATTEMPTS}, got {attempts!r}")
    age = policy.get("MaximumEventAgeInSeconds")
    lo, hi = EVENT_AGE_RANGE
    if age is not None and (type(age) is not int or not lo <= age <= hi):
        raise ValueError(f"{field}.MaximumEventAgeInSeconds: must be an integer from {lo} to "
                         f"{hi}, got {age!r}")


def retry_limits(target: dict) -> tuple[int, int]:
    """(MaximumRetryAttempts, MaximumEventAgeInSeconds) with EventBridge's defaults, 185 and
    86400: retry until either runs out, then dead-letter."""
    policy = target.get("RetryPolicy") or {}
    attempts = policy.get("MaximumRetryAttempts")
    age = policy.get("MaximumEventAgeInSeconds")
    return (MAX_RETRY_ATTEMPTS if attempts is None else attempts,
            EVENT_AGE_RANGE[1] if age is None else age)
