"""Strict reading of the JSON files users hand the tool (case, ledger, campaign state): msgspec
checks types without coercion (no bool for int, no float for int, no str for a list), and its
errors become one line that names the file and the field, e.g.
``case.json: layout.qo_indptr[0]: expected int, got float 1.7``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import msgspec
import msgspec.inspect

T = TypeVar("T")

_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_JSON_TYPE = {bool: "bool", int: "int", float: "float", str: "str", list: "array", dict: "object", type(None): "null"}
_NAMES = {"array": "list", "object": "object", "null": "null"}


def file_fields(cls: type, structs: Mapping[type, Any] | None = None,
                not_null: Collection[str] = ()) -> list[tuple[str, Any] | tuple[str, Any, Any]]:
    """The fields of a strict file struct (``msgspec.defstruct``) for dataclass ``cls``, in its order:
    its own fields as JSON gives them, types only (the dataclass checks the values). A field with a
    default may be absent (``UNSET``: the dataclass's default fills it); ``tuple[X, ...]`` is a JSON
    list, ``float`` any JSON number (an int is kept as given, so an existing file's case_id stays), a
    nested dataclass its own struct from ``structs``; ``not_null``: optional fields a file may not
    give as null (absent only)."""
    hints = typing.get_type_hints(cls)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        kind = _json_type(hints[f.name], structs or {}, nullable=f.name not in not_null)
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, kind) if required else (f.name, kind | msgspec.UnsetType, msgspec.UNSET))
    return fields


def _json_type(hint: Any, structs: Mapping[type, Any], *, nullable: bool = True) -> Any:
    """The JSON type that reads as ``hint`` (``file_fields``)."""
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = [_json_type(a, structs) for a in args if a is not type(None)]
        kind = functools.reduce(operator.or_, members)
        return kind | None if nullable and type(None) in args else kind
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return types.GenericAlias(list, (_json_type(args[0], structs),))  # list[item type], the item type computed
    if hint is float:
        return int | float
    return structs.get(hint, hint)


def convert(data: Any, schema: type[T], *, where: str, error: type[Exception], field: str = "") -> T:
    """``data`` (parsed JSON) as ``schema``, strictly; ``error(message)`` names ``where`` and the
    field (``field`` is the name of ``data`` itself inside its file, e.g. ``pa_oracle.backends.sdpa``)."""
    try:
        return msgspec.convert(data, schema, strict=True)
    except msgspec.ValidationError as exc:
        raise error(describe(exc, data, where, schema, field)) from None


def describe(exc: msgspec.ValidationError, data: Any, where: str, schema: Any = None, field: str = "") -> str:
    """One line for a msgspec error: ``WHERE: FIELD: what is wrong (the value)``."""
    text, _, at = str(exc).partition(" - at `")
    at = at.rstrip("`") if at else "$"
    path, value = _resolve(data, at, _matcher(text))
    path = field + ("." if field and path and not path.startswith("[") else "") + path
    if m := re.fullmatch(r"Expected `(.+?)`, got `(.+?)`", text):
        expected = " | ".join(_NAMES.get(t, t) for t in m[1].replace("int | float", "number").split(" | "))
        message = f"expected {expected}, got {_NAMES.get(m[2], m[2])} {_show(value)}"
    elif m := re.fullmatch(r"Object missing required field `(.+)`", text):
        path, message = _join(path, m[1]), "missing (required)"
    elif m := re.fullmatch(r"Object contains unknown field `(.+)`", text):
        known = _known_fields(schema, at)
        path, message = _join(path, m[1]), "unknown field" + (f" (known: {', '.join(known)})" if known else "")
    elif m := re.fullmatch(r"Invalid enum value (.+)", text):
        allowed = getattr(_struct_of(_type_at(schema, at)), "values", None)
        message = f"invalid value {m[1]}" + (f" (one of {', '.join(map(repr, allowed))})" if allowed else "")
    elif m := re.fullmatch(r"Expected `(.+?)` (.+)", text):  # a msgspec.Meta bound
        message = f"expected {m[1]} {m[2]}, got {_show(value)}"
    else:
        message = text[:1].lower() + text[1:]
    return f"{where}: {path}: {message}" if path else f"{where}: {message}"


def _type_at(schema: Any, path: str) -> Any:
    """msgspec's type info of what ``schema`` holds at msgspec ``path`` (None if unknown)."""
    if schema is None:
        return None
    info: Any = msgspec.inspect.type_info(schema)
    for m in _SEGMENT.finditer(path[1:]):
        info = _struct_of(info)
        if m[1] is not None:
            info = next((f.type for f in getattr(info, "fields", ()) if f.encode_name == m[1]), None)
        else:
            info = getattr(info, "item_type", None) or getattr(info, "value_type", None)
    return info


def _known_fields(schema: Any, path: str) -> list[str]:
    """The field names of the struct that ``schema`` has at msgspec ``path`` (empty if none)."""
    return [f.encode_name for f in getattr(_struct_of(_type_at(schema, path)), "fields", ())]


def _struct_of(info: Any) -> Any:
    """The struct (or literal) among a union's members (``X | None | UNSET``), else ``info``."""
    if isinstance(info, msgspec.inspect.UnionType):
        kinds = (msgspec.inspect.StructType, msgspec.inspect.LiteralType)
        return next((t for t in info.types if isinstance(t, kinds)), info)
    return info


_BOUNDS = {">=": lambda v, b: v >= b, ">": lambda v, b: v > b, "<=": lambda v, b: v <= b, "<": lambda v, b: v < b}


def _matcher(text: str) -> Callable[[Any], bool]:
    """Whether a value is the one msgspec refused: of the type it got, or outside its bound."""
    if m := re.search(r"got `(\w+)`", text):
        got = m[1]
        return lambda value: _JSON_TYPE.get(type(value)) == got
    if m := re.fullmatch(r"Expected `\w+` (>=|>|<=|<) (\S+)", text):
        ok, bound = _BOUNDS[m[1]], float(m[2])
        return lambda value: isinstance(value, (int, float)) and not ok(value, bound)
    return lambda value: True


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _resolve(data: Any, path: str, refused: Callable[[Any], bool]) -> tuple[str, Any]:
    """(dotted field name, value) of a msgspec path like ``$.layout.qo_indptr[0]``; a dict key that
    msgspec writes as ``[...]`` is found again as the first key whose value it ``refused``."""
    names: list[str] = []
    value = data
    segments = list(_SEGMENT.finditer(path[1:]))
    for i, m in enumerate(segments):
        if m[1] is not None:
            names.append(m[1] if not names else f".{m[1]}")
            value = value.get(m[1]) if isinstance(value, dict) else None
        elif m[2] == "...":
            rest = "".join(s[0] for s in segments[i + 1 :])
            key = _first_key(value, rest, refused)
            names.append(key if not names else f".{key}")
            value = value.get(key) if isinstance(value, dict) else None
        else:
            names.append(f"[{m[2]}]")
            index = int(m[2])
            value = value[index] if isinstance(value, list) and index < len(value) else None
    return "".join(names), value


def _first_key(mapping: Any, rest: str, refused: Callable[[Any], bool]) -> str:
    if not isinstance(mapping, dict):
        return "[...]"
    for key, item in mapping.items():
        _, inner = _resolve(item, "$" + rest, refused)
        if refused(inner):
            return str(key)
    return "[...]"


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
