"""The Engine protocol: what serving needs from a model, whatever runs it.

An engine turns chat requests into generations and reports, for every generated token, its id and logprob, and
the release whose weights produced it (training needs all three). Engines batch concurrent requests themselves:
callers submit one request each and block on its result or iterate its text deltas.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from reef_lab.engines.tools import ToolUse


@dataclass
class SamplingParams:
    """Sampling settings common to every dialect (OpenAI, Anthropic)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class ChatRequest:
    """One chat conversation to continue. Messages are {"role": system|user|assistant|tool, "content": str}; an
    assistant message may carry `tool_calls` [{"id", "type": "function", "function": {"name", "arguments": dict}}]
    and a tool message answers one by `tool_call_id` (and `name`), as transformers' chat templates take them.
    `tool_use` holds the tools the request offers and its tool choice (reef_lab/engines/tools.py). `dropped` lists
    what of the client's request the model does not see (a hosted tool no engine here runs), for the record."""

    messages: list[dict]
    params: SamplingParams = field(default_factory=SamplingParams)
    scenario: str | None = None  # the engine serves the release routed to this scenario (base weights if none)
    release: str | None = None  # or exactly this loaded release (e.g. a candidate under evaluation)
    prompt_ids: list[int] | None = None  # the prompt as token ids, already templated (then `messages` is unused)
    tool_use: ToolUse | None = None
    dropped: list[str] = field(default_factory=list)


@dataclass
class Generation:
    """A finished generation. `logprobs[i]` is the log-probability of `token_ids[i]` under the sampling
    distribution (logits / temperature, before top-p truncation; raw logits when temperature is 0)."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    prompt_token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens reached)
    release_id: str
    stop_sequence: str | None = None  # the stop string that ended the text, if one did


class GenerationStream(Protocol):
    """A submitted request. Iterating yields text deltas as they are decoded; `result()` blocks until done.
    `release_id` is the release it was pinned to at submit (known before the first token); `prompt_ids` the
    prompt's token ids (known at submit: a stream reports its prompt size before the first token)."""

    release_id: str
    prompt_ids: list[int]

    def __iter__(self) -> Iterator[str]: ...

    def result(self, timeout: float | None = None) -> Generation: ...

    def cancel(self) -> None: ...


class Engine(ABC):
    """What every engine is: a named model the gateway serves through. An engine also derives from one (or more) of
    the capability classes below, and the gateway and learners ask for a capability with `isinstance`:

    - `Generator`: generates from ChatRequests and reports token ids and logprobs (embedded, vLLM, SGLang);
    - `Relay`: passes provider-format bodies to a provider as they are (an OpenAI/Anthropic-compatible API);
    - `ReleaseHost`: loads trained releases beside the base weights and routes scenarios to them.

    A deployment names its engine (`--engine`) by a short name of `ENGINES` (reef_lab/engines/__init__.py) or a
    `module:Class` path; the class builds itself from the deployment's config with `from_config`.
    """

    model_name: str
    hub_id: str | None = None  # the base model's Hub id, named in release model cards (None: model_name)

    @classmethod
    @abstractmethod
    def from_config(cls, cfg) -> Engine:
        """Build from a reef_lab.config.ServeConfig (its `engine_options` mapping holds this engine's own settings)."""

    @classmethod
    def check_options(cls, options: dict) -> None:
        """Refuse `engine_options` this engine cannot use (ValueError naming them); called when the deployment's
        config is built, before any model loads. By default anything goes (from_config reads them)."""

    @staticmethod
    def no_options(name: str, options: dict) -> None:
        """check_options of an engine that takes none."""
        if options:
            raise ValueError(f"the {name} engine takes no engine_options, got {sorted(options)}")

    @abstractmethod
    def info(self) -> dict: ...

    @abstractmethod
    def close(self) -> None: ...


class Generator(Engine):
    """An engine that generates: batching is its own; callers submit one request each."""

    @property
    @abstractmethod
    def release_id(self) -> str:
        """The base weights' release id (scenarios without a route are served by it)."""

    @abstractmethod
    def submit(self, request: ChatRequest) -> GenerationStream: ...

    @abstractmethod
    def release_for(self, scenario: str | None) -> str: ...

    @abstractmethod
    def count_tokens(self, messages: list[dict]) -> int: ...


class ReleaseHost(ABC):
    """An engine whose weights can be trained: releases load beside what serves, scenarios are routed to them.
    `model_dir` is the Hugging Face folder of the base weights (trainers start there)."""

    model_dir: Path | None = None

    @abstractmethod
    def load_release(self, release_id: str, folder: str | Path) -> None:
        """Load a checkpoint beside what is serving; raise and change nothing if it is broken."""

    @abstractmethod
    def route(self, scenario: str, release_id: str) -> None:
        """New requests of the scenario get that release; requests already running finish on theirs."""

    @abstractmethod
    def unload(self, release_id: str) -> None: ...

    @abstractmethod
    def loaded_releases(self) -> list[str]: ...

    @abstractmethod
    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The token ids the engine would prompt with (its chat template), for training on demonstrations."""

    @abstractmethod
    def request_ids(self, request: ChatRequest) -> list[int]:
        """The prompt a generation request is served with: its messages, its tools and its tool choice's prefill
        (a learner re-making a served prompt, e.g. context distillation without the harness)."""

    @abstractmethod
    def completion_ids(self, text: str) -> list[int]:
        """A completion's token ids, ending as the model ends a turn."""

    @abstractmethod
    def vocab_size(self) -> int:
        """How many token ids the model's tokenizer has: an imported record's ids must lie in [0, this) before the
        trainer may embed them (an id beyond the table fails the round on CPU and poisons the process on CUDA)."""


class YieldsToTraining(ABC):
    """An engine that stands aside while a training step runs on the CPUs it shares with the trainer (an external
    server on this machine, whose threads would otherwise keep the cores: results/train-beside-vllm.md).
    Requests that arrive meanwhile wait and are answered once the step is done."""

    @abstractmethod
    def training_step(self) -> AbstractContextManager:
        """Held around one training step: generation pauses while it is held (by any learner), then resumes."""


class Relay(Engine):
    """An engine that passes provider-format bodies through. `model` replaces the client's model name when set;
    `base_url` is the provider's (an OpenAI-compatible one also serves as a plain LM, reef_lab.engines.lm)."""

    model: str | None
    base_url: str
    upstream_dialect: str | None = None  # the provider's dialect when it differs from clients' (the relay translates)

    @abstractmethod
    def forward(self, path: str, body: dict, client_headers: dict[str, str]):
        """One non-streaming call: an UpstreamReply (status, body bytes, content type, passed headers)."""

    @abstractmethod
    def open_stream(self, path: str, body: dict, client_headers: dict[str, str]):
        """(reply head, iterator of raw SSE events)."""

    @abstractmethod
    def get(self, path: str): ...
