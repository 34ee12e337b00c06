"""Whole-config validation: every key at every depth is known and of its declared type, or the config is refused
with the key's path.

Why: recipe configs nest mappings (`eval_task`, `trainer`, `search`, ...) that used to be checked only when first
used, so a typo (`eval_task: {name: arithmatic}`, `trainer: {lrr: 1e-5}`) started a server that failed on the
first report. A config dataclass calls `check_fields(self)` first in its `__post_init__`. A field typed with a config
dataclass (`trainer: TrainerConfig`) takes a mapping and keeps the dataclass built from it, so what was validated
is what the code uses; a mapping-valued field that stays a mapping may name the dataclass its keys belong to with
`field(metadata={"schema": ...})`, and is checked by building it.
"""

from __future__ import annotations

import types
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Union

from reef_lab.plugins import code_paths


def check_fields(obj: Any, path: str = "") -> None:
    """Raise ValueError naming the first field of dataclass `obj` (at any depth) whose value does not fit."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value, where = getattr(obj, f.name), f"{path}{f.name}"
        nested = config_class(hints.get(f.name, Any))
        if nested is not None and isinstance(value, dict):  # a mapping becomes the dataclass, kept
            value = build(nested, value, where)
            object.__setattr__(obj, f.name, value)
        check_type(value, hints.get(f.name, Any), where)
        schema = f.metadata.get("schema")
        if schema is not None and value is not None:
            build(schema() if not is_dataclass(schema) else schema, value, where)


def config_class(tp: Any) -> type | None:
    """The config dataclass a field's type names (itself, or one arm of `X | None`), if any."""
    if is_dataclass(tp):
        return tp
    if typing.get_origin(tp) in (Union, types.UnionType):
        found = [a for a in typing.get_args(tp) if is_dataclass(a)]
        return found[0] if len(found) == 1 else None
    return None


def build(cls: type, data: Any, where: str):
    """`cls(**data)` for a mapping whose keys are all fields of `cls`; errors name `where` and the key."""
    if is_dataclass(data) and isinstance(data, cls):
        check_fields(data, where + ".")
        return data
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping of {cls.__name__} fields, got {type(data).__name__}")
    names = [f.name for f in fields(cls)]
    for key in data:
        if key not in names:
            raise ValueError(f"{where}.{key} is not a {cls.__name__} field; the fields are {names}")
    try:
        obj = cls(**data)
    except (TypeError, ValueError) as e:
        msg = str(e)
        lead = msg.split(" ", 1)[0].split("[", 1)[0].split(".", 1)[0]
        raise ValueError(f"{where}.{msg}" if lead in names else f"{where}: {msg}") from None
    check_fields(obj, where + ".")
    return obj


def check_client_fields(cls: type | None, data: Any, where: str = "config") -> None:
    """Refuse a config a client sent (POST /reef/scenarios, or a client's scenario read back at start) that names code
    or sets a field only the operator may set; the operator sets those in --recipe-config.

    Code, by default deny: any string at any depth (keys included, whatever the field) that the plug-in loader would
    import (reef_lab.plugins.names_code), so a field added later cannot let a client choose code. Operator-only: a
    field marked `field(metadata={"operator": True})` at any depth of `cls`'s schema (a file to read or write, an
    endpoint and the environment variable whose value is sent to it as a key, the sandbox's limits)."""
    named = code_paths(data, where)
    if named:
        at, path = named[0]
        raise ValueError(f"{at} = {path[:80]!r} names code to import (module:Class), which only the server's "
                         "operator may do (--recipe-config); a client may use the short names")
    if cls is not None and is_dataclass(cls):
        _check_operator_fields(cls, data, where)


def _check_operator_fields(cls: type, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        return
    by_name = {f.name: f for f in fields(cls)}
    for key, value in data.items():
        f = by_name.get(key)
        if f is None:
            continue  # unknown keys are refused when the config is built, with the allowed ones listed
        if f.metadata.get("operator"):
            raise ValueError(f"{where}.{key} can be set only by the server's operator (--recipe-config), not by "
                             "a client")
        schema = f.metadata.get("schema") or config_class(typing.get_type_hints(cls).get(key, Any))
        if schema is not None and isinstance(value, dict):
            _check_operator_fields(schema() if not is_dataclass(schema) else schema, value, f"{where}.{key}")


def check_type(value: Any, tp: Any, where: str) -> None:
    if tp is Any or tp is object:
        return
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for arm in typing.get_args(tp):
            try:
                return check_type(value, arm, where)
            except ValueError:
                continue
        raise ValueError(f"{where} must be {' or '.join(_name(a) for a in typing.get_args(tp))}, got {value!r}")
    if tp is type(None):
        if value is not None:
            raise ValueError(f"{where} must be null, got {value!r}")
        return
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where} must be a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        for i, v in enumerate(value):
            check_type(v, item, f"{where}[{i}]")
        return
    elif origin is dict or tp is dict:
        ok = isinstance(value, dict)
    elif is_dataclass(tp):
        ok = isinstance(value, tp)
    else:
        return  # a type this checker does not know: the dataclass's own __post_init__ judges it
    if not ok:
        hint = " (a string: YAML reads 1e-5 as text, write 1.0e-5)" if tp is float and isinstance(value, str) else ""
        raise ValueError(f"{where} must be {_name(tp)}, got {value!r}{hint}")


def _name(tp: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))
