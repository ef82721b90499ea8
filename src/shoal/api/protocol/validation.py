"""Validate a request body against botocore's service model.

AWS checks every request against the same model botocore ships: required members, types,
enums, lengths and ranges, unions. We walk the input shape and report the first problem with
the dotted path of the field, e.g. `containerDefinitions[0].resourceRequirements[0].type`.
"""

from __future__ import annotations

from functools import lru_cache

import botocore.session
from botocore.model import OperationModel, ServiceModel, Shape

from shoal.domain.errors import InvalidParameter


@lru_cache(maxsize=None)
def service_model(name: str) -> ServiceModel:
    return botocore.session.get_session().get_service_model(name)


def validate(op: OperationModel, params: object) -> None:
    shape = op.input_shape
    if shape is None:
        return
    if not isinstance(params, dict):
        raise InvalidParameter("The request body must be a JSON object.")
    _check(shape, params, "")


def _join(path: str, member: str) -> str:
    return f"{path}.{member}" if path else member


def _fail(path: str, message: str) -> None:
    raise InvalidParameter(f"Invalid parameter '{path}': {message}")


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _check(shape: Shape, value: object, path: str) -> None:
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure":
        if not isinstance(value, dict):
            _fail(path or "body", f"expected an object, got {_type_name(value)}.")
        members = shape.members
        for name in shape.required_members:
            if value.get(name) is None:
                raise InvalidParameter(f"Missing required parameter '{_join(path, name)}'.")
        present = [k for k, v in value.items() if v is not None and k in members]
        if meta.get("union") and len(present) != 1:
            _fail(path, f"exactly one of {sorted(members)} must be set, got {len(present)}.")
        for name in present:
            _check(members[name], value[name], _join(path, name))
    elif kind == "list":
        if not isinstance(value, list):
            _fail(path, f"expected an array, got {_type_name(value)}.")
        _check_size(path, len(value), meta, "items")
        for i, item in enumerate(value):
            if item is None:
                _fail(f"{path}[{i}]", "must not be null.")
            _check(shape.member, item, f"{path}[{i}]")
    elif kind == "map":
        if not isinstance(value, dict):
            _fail(path, f"expected an object, got {_type_name(value)}.")
        _check_size(path, len(value), meta, "entries")
        for k, v in value.items():
            _check(shape.key, k, f"{path}.{k}")
            _check(shape.value, v, f"{path}.{k}")
    elif kind == "string":
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {_type_name(value)}.")
        if shape.enum and value not in shape.enum:
            _fail(path, f"'{value}' is not one of [{', '.join(shape.enum)}].")
        _check_size(path, len(value), meta, "characters")
    elif kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"expected an integer, got {_type_name(value)}.")
        _check_range(path, value, meta)
    elif kind in ("double", "float"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            _fail(path, f"expected a number, got {_type_name(value)}.")
        _check_range(path, value, meta)
    elif kind == "boolean":
        if not isinstance(value, bool):
            _fail(path, f"expected a boolean, got {_type_name(value)}.")
    elif kind == "timestamp":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            _fail(path, f"expected a timestamp, got {_type_name(value)}.")
    elif kind == "blob":
        if not isinstance(value, str):
            _fail(path, f"expected base64 text, got {_type_name(value)}.")


def _check_size(path: str, size: int, meta: dict, unit: str) -> None:
    if "min" in meta and size < meta["min"]:
        _fail(path, f"must have at least {meta['min']} {unit}, got {size}.")
    if "max" in meta and size > meta["max"]:
        _fail(path, f"must have at most {meta['max']} {unit}, got {size}.")


def _check_range(path: str, value: float, meta: dict) -> None:
    if "min" in meta and value < meta["min"]:
        _fail(path, f"must be at least {meta['min']}, got {value}.")
    if "max" in meta and value > meta["max"]:
        _fail(path, f"must be at most {meta['max']}, got {value}.")
