"""Engines by name: a deployment's `--engine` is a short name below or a `module:Class` path (an operator's choice,
never a client's). An engine class derives from reef_lab.engines.base.Engine and its capability classes."""

from __future__ import annotations

import importlib

from reef_lab.engines.base import Engine

ENGINES = {"embedded": "reef_lab.engines.embedded:EmbeddedEngine",
           "upstream": "reef_lab.engines.upstream:UpstreamEngine",
           "sglang": "reef_lab.engines.sglang:SGLangEngine",
           "vllm": "reef_lab.engines.vllm:VLLMEngine"}


def engine_class(spec: str) -> type[Engine]:
    path = ENGINES.get(spec, spec)
    module, sep, name = path.partition(":")
    if not sep:
        raise ValueError(f"engine {spec!r} is neither one of {sorted(ENGINES)} nor a module:Class path")
    try:
        klass = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"engine {spec!r} cannot be loaded from {path!r}: {e}") from e
    if not (isinstance(klass, type) and issubclass(klass, Engine)):
        raise ValueError(f"engine {spec!r} ({path}) is not a reef_lab.engines.base.Engine subclass")
    return klass
