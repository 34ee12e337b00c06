"""Loading a class named by a `module:Class` path (engines, tasks, trainers): the operator's extension point."""

from __future__ import annotations

import importlib


def load_class(path: str, base: type, what: str) -> type:
    """The class at `module:Class`, which must derive from `base`; ValueError naming `what` and the fix."""
    module, sep, name = path.partition(":")
    if not sep:
        raise ValueError(f"{what} {path!r} is not a module:Class path")
    try:
        klass = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} {path!r} cannot be loaded: {e}") from e
    if not (isinstance(klass, type) and issubclass(klass, base)):
        raise ValueError(f"{what} {path!r} is not a {base.__module__}.{base.__name__} subclass")
    return klass
