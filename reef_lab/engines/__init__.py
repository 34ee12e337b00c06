"""Engines by name: a deployment's `--engine` is a short name below or a `module:Class` path (an operator's choice,
never a client's). An engine class derives from reef_lab.engines.base.Engine and its capability classes."""

from __future__ import annotations

from reef_lab.engines.base import Engine
from reef_lab.plugins import load_class

ENGINES = {"embedded": "reef_lab.engines.embedded:EmbeddedEngine",
           "upstream": "reef_lab.engines.upstream:UpstreamEngine",
           "sglang": "reef_lab.engines.sglang:SGLangEngine",
           "vllm": "reef_lab.engines.vllm:VLLMEngine"}


def engine_class(spec: str) -> type[Engine]:
    if spec not in ENGINES and ":" not in spec:
        raise ValueError(f"engine {spec!r} is neither one of {sorted(ENGINES)} nor a module:Class path")
    return load_class(spec, Engine, "engine", names=ENGINES)
