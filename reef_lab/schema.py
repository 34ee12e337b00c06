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

import orjson

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


CLIENT_MAX_CHARS = 4096  # the longest string (keys included) a client may put in a config field without its own bound
CLIENT_CONFIG_BYTES = 256 << 10  # the most a client's whole config may weigh, as JSON


def check_client_fields(cls: type | None, data: Any, where: str = "config") -> None:
    """Refuse a config a client sent (POST /reef/scenarios, or a client's scenario read back at start) unless every
    key it sets, at any depth and inside any container, is on the client allow-list `client_fields` derives from the
    typed config `cls`; the operator sets everything else in --recipe-config.

    Two rules. Code, by default deny: any string at any depth (keys included, whatever the field) that the plug-in
    loader would import (reef_lab.plugins.names_code). Fields, by construction: a client may set a field only when
    its declared type says all it can hold (plain values, lists and mappings of them, or a config dataclass walked
    in turn) and it is not marked `field(metadata={"operator": True})` (a file to read or write, an endpoint and the
    environment variable whose value is sent to it as a key, the sandbox's limits, the device); a free-form mapping
    (`dict`, `Any`) is the operator's, so a field added later, or a container a check did not know, cannot carry a
    client past the rule. A number field may carry `client_max`: the most a client may ask for (work and memory the
    server spends on the scenario). Sizes, by default bound: every string (keys included) holds at most
    CLIENT_MAX_CHARS characters unless its field says more with `client_max_chars` (a harness file), and the whole
    config weighs at most CLIENT_CONFIG_BYTES as JSON (a tenant's config is kept, read back at start and shown). A
    mapping whose keys belong to a dataclass named by a sibling field (a composite's component config, by its recipe;
    a task's options, by its task) says so with `schema_by`: a function of the mapping that holds the field,
    returning the dataclass (None: untyped, the operator's)."""
    size = len(orjson.dumps(data, default=str))
    if size > CLIENT_CONFIG_BYTES:
        raise ValueError(f"{where} is {size} bytes as JSON; a client's config may be at most {CLIENT_CONFIG_BYTES} "
                         "(the server's operator may set larger ones in --recipe-config)")
    named = code_paths(data, where)
    if named:
        at, path = named[0]
        raise ValueError(f"{at} = {path[:80]!r} names code to import (module:Class), which only the server's "
                         "operator may do (--recipe-config); a client may use the short names")
    if cls is None or not is_dataclass(cls):
        if data:
            raise ValueError(f"{where}: this recipe's config is not typed (no config dataclass), so only the server's "
                             "operator may set it (--recipe-config)")
        return
    _client_mapping(cls, data, where)


def _client_mapping(cls: type, data: Any, where: str) -> None:
    if not isinstance(data, dict):
        return  # not a mapping: building the config refuses it, naming the type
    by_name = {f.name: f for f in fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in data.items():
        f = by_name.get(key)
        if f is None:
            continue  # unknown keys are refused when the config is built, with the allowed ones listed
        _client_field(hints.get(key, Any), f.metadata, data, value, f"{where}.{key}")


def _client_field(tp: Any, meta: Any, parent: dict, value: Any, where: str) -> None:
    if meta.get("operator"):
        raise ValueError(f"{where} can be set only by the server's operator (--recipe-config), not by a client")
    most = meta.get("client_max")
    if most is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value > most:
        raise ValueError(f"{where} = {value} is more than a client may ask for (at most {most}); the server's "
                         "operator may set more (--recipe-config)")
    if "schema_by" in meta:
        schema = meta["schema_by"](parent)
        if schema is None:
            if value:
                raise ValueError(f"{where} is a free-form mapping here (no typed fields), so only the server's "
                                 "operator may set it (--recipe-config)")
            return
        return _client_mapping(schema, value, where)
    schema = meta.get("schema")
    if schema is not None:
        return _client_mapping(schema if is_dataclass(schema) else schema(), value, where)
    if config_class(tp) is None or not isinstance(value, dict):  # a leaf: a nested config is walked field by field
        _client_chars(value, meta.get("client_max_chars", CLIENT_MAX_CHARS), where)
    _client_value(tp, value, where)


_PLAIN = (bool, int, float, str, type(None))


def _client_chars(value: Any, most: int, where: str) -> None:
    """Every string in `value` (mapping keys too, at any depth) holds at most `most` characters."""
    if isinstance(value, str):
        if len(value) > most:
            raise ValueError(f"{where} is {len(value)} characters long; a client may set at most {most} here (the "
                             "server's operator may set longer ones in --recipe-config)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _client_chars(key, most, f"{where} (a key)")
            _client_chars(item, most, f"{where}.{key}"[:200])
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _client_chars(item, most, f"{where}[{i}]")


def _client_value(tp: Any, value: Any, where: str) -> None:
    """A value a client may give to a field declared `tp`: plain values, lists and mappings of what their type
    parameters allow, config dataclasses walked field by field; anything untyped is the operator's."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _PLAIN:
        return  # its type is checked when the config is built
    if is_dataclass(tp):
        return _client_mapping(tp, value, where)
    if origin in (Union, types.UnionType):
        nested = config_class(tp)
        if nested is not None and isinstance(value, dict):
            return _client_mapping(nested, value, where)
        arms = [a for a in args if not is_dataclass(a)]
        errors = []
        for arm in arms:
            try:
                return _client_value(arm, value, where)
            except ValueError as e:
                errors.append(e)
        raise errors[0]
    if origin is list and args:
        for i, item in enumerate(value if isinstance(value, (list, tuple)) else []):
            _client_value(args[0], item, f"{where}[{i}]")
        return
    if origin is dict and len(args) == 2 and args[0] is str:
        for key, item in (value.items() if isinstance(value, dict) else []):
            _client_value(args[1], item, f"{where}.{key}")
        return
    if value in (None, {}, []):
        return  # nothing set
    raise ValueError(f"{where} is free-form ({_name(tp)}, no typed fields), so only the server's operator may set it "
                     "(--recipe-config)")


def client_fields(cls: type, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, field metadata) of every field a client may set in config dataclass `cls`, walking nested
    config dataclasses and `schema` mappings (a `schema_by` mapping depends on its sibling, so it is listed as
    itself): the allow-list that check_client_fields enforces, for docs and tests."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("operator"):
            continue
        tp = hints.get(f.name, Any)
        schema = f.metadata.get("schema") or config_class(tp)
        if schema is not None and "schema_by" not in f.metadata:
            out += client_fields(schema if is_dataclass(schema) else schema(), f"{prefix}{f.name}.")
        elif "schema_by" in f.metadata or _typed(tp):
            out.append((prefix + f.name, f.metadata))
    return out


def _typed(tp: Any) -> bool:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in _PLAIN or is_dataclass(tp):
        return True
    if origin in (Union, types.UnionType):
        return all(_typed(a) for a in args)
    if origin is list and args:
        return _typed(args[0])
    return origin is dict and len(args) == 2 and args[0] is str and _typed(args[1])


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
