"""Typed fields for Hearth's settings objects, checked by pydantic in strict mode.

A field's annotation is its schema: `Annotated[float, Field(gt=0, le=1), Rule("top-p", "in (0, 1]")]`. Strict
means JSON's `"false"` is not a boolean and `"5"` is not a number, so a hand-edited file can never switch an
opt-in on by accident; non-finite floats are refused everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError

from app.core.errors import InvalidSettingError
from app.core.storage import staging

_STRICT = ConfigDict(strict=True, allow_inf_nan=False)
_CONSTRAINT_ERRORS = frozenset(
    {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "too_short",
        "too_long",
        "string_pattern_mismatch",
    }
)


@dataclass(frozen=True)
class Rule:
    """How people name a field, and what a valid value is beyond its type (e.g. "at least 16 tokens")."""

    label: str
    expected: str = ""


@dataclass(frozen=True)
class FieldProblem:
    key: str  # the field's name, dotted for nested objects ("sampling.top_p")
    message: str  # names the key, what is expected and what was found


@cache
def _field_types(cls: type) -> dict[str, tuple[TypeAdapter[Any] | type, Rule, str]]:
    """Per field: a strict validator (or, for a nested settings object, its class), its Rule, its type in words."""
    hints = typing.get_type_hints(cls, include_extras=True)
    result: dict[str, tuple[TypeAdapter[Any] | type, Rule, str]] = {}
    for item in dataclasses.fields(cls):
        hint = hints[item.name]
        rule = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Rule)), None)
        rule = rule or Rule(item.name.replace("_", " "))
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            result[item.name] = (hint, rule, "a JSON object")  # validated by its own __post_init__
        else:
            result[item.name] = (TypeAdapter(hint, config=_STRICT), rule, _describe_type(hint))
    return result


def _describe_type(hint: Any) -> str:
    """What a valid value looks like, in the words of a JSON file."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        named = [_describe_type(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    names = {bool: "true or false", int: "a whole number", float: "a finite number", str: "text"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def shown(value: Any) -> str:
    """A value as it would look in the JSON file (so `"false"` keeps its quotes)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_field(cls: type, name: str, value: Any, *, key: str | None = None) -> Any:
    """The validated value of one field, or InvalidSettingError naming it (by `key` if given, else its label)."""
    adapter, rule, type_text = _field_types(cls)[name]
    if isinstance(adapter, type):
        if not isinstance(value, adapter):
            raise InvalidSettingError(f"{key or rule.label} must be {type_text} (got {shown(value)})")
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        kinds = {str(error["type"]) for error in exc.errors()}
        expected = rule.expected if rule.expected and kinds <= _CONSTRAINT_ERRORS else type_text
        raise InvalidSettingError(f"{key or rule.label} must be {expected} (got {shown(value)})") from None


def check_fields(instance: Any) -> None:
    """For __post_init__: validate (and normalise, e.g. 0 → 0.0) every field of a frozen dataclass."""
    cls: type = type(instance)
    for name in _field_types(cls):
        value = check_field(cls, name, getattr(instance, name))
        object.__setattr__(instance, name, value)


def field_names(cls: type) -> tuple[str, ...]:
    return tuple(item.name for item in dataclasses.fields(cls))


@dataclass(frozen=True)
class Parsed:
    """A settings object read from a mapping: bad values replaced by defaults, each one reported."""

    value: Any
    problems: tuple[FieldProblem, ...]
    unknown_keys: tuple[str, ...]


def from_mapping(cls: type, data: dict[str, Any], *, prefix: str = "", ignore: frozenset[str] = frozenset()) -> Parsed:
    """Build `cls` from a JSON object field by field: one bad value never costs the others, never raises."""
    known = field_names(cls)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    problems: list[FieldProblem] = []
    unknown = [f"{prefix}{key}" for key in data if key not in known and key not in ignore]
    for name in known:
        if name not in data:
            continue
        key, value = f"{prefix}{name}", data[name]
        nested = hints.get(name)
        if dataclasses.is_dataclass(nested) and isinstance(nested, type):
            if not isinstance(value, dict):
                problems.append(FieldProblem(key, f"{key} must be a JSON object (got {shown(value)})"))
                continue
            inner = from_mapping(nested, value, prefix=f"{key}.")
            problems.extend(inner.problems)
            unknown.extend(inner.unknown_keys)
            values[name] = inner.value
            continue
        try:
            values[name] = check_field(cls, name, value, key=key)
        except InvalidSettingError as exc:
            problems.append(FieldProblem(key, str(exc)))
    try:
        instance = cls(**values)
    except InvalidSettingError as exc:  # a rule across fields: fall back to the defaults for all of them
        problems.append(FieldProblem(prefix.rstrip(".") or cls.__name__, str(exc)))
        instance = cls()
    return Parsed(instance, tuple(problems), tuple(unknown))


def read_json_file(path: Path) -> tuple[Any, str]:
    """A JSON file Hearth owns: (data, "") or (None, why it cannot be read), worded to follow the file's name.
    Never raises: settings and engines files report a damaged file instead of failing on it."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        return json.loads(raw.decode("utf-8")), ""
    except UnicodeDecodeError as exc:
        return None, f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
    except RecursionError:
        return None, "is nested too deeply to read"


def write_json_file(path: Path, data: Any, *, sort_keys: bool = False) -> None:
    """Write atomically: a crash mid-write never leaves a half-written file (a temporary file named for this process,
    fsync, rename: staging.write_atomically)."""
    text = json.dumps(data, indent=2, sort_keys=sort_keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging.write_atomically(path, text.encode("utf-8"))
