"""JSON for the hot paths (documents, events, agent protocol, AWS protocol bodies): orjson,
several times faster than the standard library for the same text. Compact output, UTF-8."""

from __future__ import annotations

import orjson

JSONDecodeError = orjson.JSONDecodeError  # a ValueError, as json's is


def loads(text: str | bytes):
    return orjson.loads(text)


def dumpb(value, *, sort_keys: bool = False) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else 0)


def dumps(value, *, sort_keys: bool = False) -> str:
    return dumpb(value, sort_keys=sort_keys).decode()
