"""Loading a class named by a `module:Class` path (engines, tasks, trainers, problems, recipes): the operator's
extension point, and the one place that decides which strings can name code.

Why one place: importing a module runs its code, so a string that reaches the loader is code. `names_code(s)` is
true exactly for the strings the loader would import (a dotted module of identifiers, a colon, an identifier; the
loader refuses anything else before importing), and a config a client sent is refused if any string in it, at any
depth, is one of those (reef_lab.schema.check_client_fields). A second guard sits in the loader itself: a server
process calls `restrict_to(paths)` with the paths its operator named (config file, command line), after which only
those and each call's built-in `names` resolve, whatever field a path arrived through.
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Iterable, Mapping

_PATH = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*:[^\W\d]\w*")
_allowed: frozenset[str] | None = None  # None: any path resolves (in-process use: experiments, notebooks, tests)


def names_code(value: str) -> bool:
    """Whether `value` (leading and trailing blanks ignored) is a `module:Class` path the loader would import."""
    return _PATH.fullmatch(value.strip()) is not None


def code_paths(value: Any, where: str = "") -> list[tuple[str, str]]:
    """(where, string) for every string in `value` (mappings' keys and values, lists, at any depth) that names
    code; `where` is the dotted path to it (a key that names code is reported at its own path)."""
    found, stack = [], [(where, value)]
    while stack:
        at, v = stack.pop()
        if isinstance(v, str):
            if names_code(v):
                found.append((at, v.strip()))
        elif isinstance(v, dict):
            stack += [(f"{at}.{k}", k) for k in v if isinstance(k, str)]
            stack += [(f"{at}.{k}", item) for k, item in v.items()]
        elif isinstance(v, (list, tuple)):
            stack += [(f"{at}[{i}]", item) for i, item in enumerate(v)]
    return sorted(found)


def restrict_to(paths: Iterable[str]) -> None:
    """From now on, in this process, resolve only built-in names and `paths` (what the operator named)."""
    global _allowed
    _allowed = frozenset(p.strip() for p in paths)


def unrestricted() -> None:
    """Undo restrict_to (tests)."""
    global _allowed
    _allowed = None


def import_path(path: str, what: str, builtin: bool = False) -> Any:
    """The object at `module:Name`; ValueError naming `what` when the path is malformed, not the operator's (in a
    restricted process, unless `builtin`: it came from the code's own table of names) or cannot be imported."""
    if not isinstance(path, str) or _PATH.fullmatch(path) is None:
        raise ValueError(f"{what} {path!r} is not a module:Class path")
    if _allowed is not None and not builtin and path not in _allowed:
        raise ValueError(f"{what} {path!r} names code the server's operator did not name (in the config file or on "
                         "the command line); only the operator may choose code to import")
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} {path!r} cannot be loaded: {e}") from e


def load_class(spec: str, base: type, what: str, names: Mapping[str, str] | None = None) -> type:
    """The class `spec` names, which must derive from `base`: a short name of `names` (the built-in table) or a
    `module:Class` path; ValueError naming `what` and the fix."""
    builtin = names is not None and isinstance(spec, str) and spec in names
    klass = import_path(names[spec] if builtin else spec, what, builtin=builtin)
    if not (isinstance(klass, type) and issubclass(klass, base)):
        raise ValueError(f"{what} {spec!r} is not a {base.__module__}.{base.__name__} subclass")
    return klass
