"""Reading a pattern into a tree that keeps JSON objects as ordered (key, value) pairs.

event-ruler reads a pattern as a token stream, so a key that occurs twice in one object is seen
twice (the later occurrence of a leaf path overrides the earlier one, and two occurrences of an
object key both contribute their fields). Python dicts would keep only the last value, so objects
are kept as `Obj` (a list of pairs) until the compiler has walked them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from shoal.events.patterns.errors import InvalidEventPattern


class Obj(list):
    """A JSON object as an ordered list of (key, value) pairs; duplicate keys are kept."""

    __slots__ = ()


_EXPECTING = "was expecting (JSON String, Number, Array, Object or token 'null', 'true' or 'false')"
_TOKEN = re.compile(r"[A-Za-z0-9_$+\-.]+")


def _non_standard(token: str):
    raise InvalidEventPattern(
        f"Non-standard token '{token}': enable `JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS` to allow")


def _jackson_reason(text: str, err: json.JSONDecodeError) -> str:
    """A reason worded like Jackson's (what AWS answers) for the common syntax errors.

    event-ruler reads tokens one at a time, so input that does not start an object is reported
    as "Filter is not an object" before any later syntax error is seen.
    """
    first = text.lstrip(" \t\r\n")[:1]
    if first in ("", "[", '"'):
        return "Filter is not an object"
    pos = err.pos
    ch = text[pos] if 0 <= pos < len(text) else ""
    if err.msg == "Expecting value" and ch:
        token = _TOKEN.match(text, pos)
        if token:
            return f"Unrecognized token '{token.group()}': {_EXPECTING}"
        return f"Unexpected character ('{ch}' (code {ord(ch)})): expected a value"
    if err.msg.startswith("Expecting property name") and ch:
        return (f"Unexpected character ('{ch}' (code {ord(ch)})): "
                "was expecting double-quote to start field name")
    if not ch:
        return "Unexpected end-of-input: expected close marker for Object"
    return f"{err.msg} at line {err.lineno}, column {err.colno}"


def load_text(text: str | bytes) -> Any:
    """Parse pattern JSON text; objects become `Obj`. Raises InvalidEventPattern."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidEventPattern("Invalid UTF-8 in pattern") from None
    try:
        return json.loads(text, object_pairs_hook=Obj, parse_constant=_non_standard)
    except json.JSONDecodeError as err:
        raise InvalidEventPattern(_jackson_reason(text, err)) from None
    except RecursionError:
        raise InvalidEventPattern("Pattern is nested too deeply") from None


def from_python(value: Any, depth: int = 0) -> Any:
    """Convert a pattern given as Python data (dicts, lists, scalars) into the same tree."""
    if depth > 200:
        raise InvalidEventPattern("Pattern is nested too deeply")
    if isinstance(value, dict):
        out = Obj()
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidEventPattern(f"Field names must be strings, not {type(key).__name__}")
            out.append((str.__str__(key), from_python(item, depth + 1)))
        return out
    if isinstance(value, (list, tuple)):
        return [from_python(item, depth + 1) for item in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            _non_standard("NaN" if math.isnan(value) else "Infinity")
        return float(value)
    raise InvalidEventPattern(f"Unsupported value in pattern: {type(value).__name__}")
