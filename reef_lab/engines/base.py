"""The Engine protocol: what serving needs from a model, whatever runs it.

An engine turns chat requests into generations and reports, for every generated token, its id and logprob, and
the release whose weights produced it (training needs all three). Engines batch concurrent requests themselves:
callers submit one request each and block on its result or iterate its text deltas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol


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
    """One chat conversation to continue. Messages are {"role": system|user|assistant, "content": str}."""

    messages: list[dict]
    params: SamplingParams = field(default_factory=SamplingParams)
    scenario: str | None = None  # the engine serves the release routed to this scenario (base weights if none)
    release: str | None = None  # or exactly this loaded release (e.g. a candidate under evaluation)


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
    `release_id` is the release it was pinned to at submit (known before the first token)."""

    release_id: str

    def __iter__(self) -> Iterator[str]: ...

    def result(self, timeout: float | None = None) -> Generation: ...

    def cancel(self) -> None: ...


class Engine(Protocol):
    """Serving backend. `relays` is False for engines that generate from ChatRequests (embedded, SGLang).

    Engines that serve trainable weights also offer `load_release(release_id, folder)` (load a checkpoint beside
    what is serving; raises and changes nothing if it is broken), `route(scenario, release_id)` (new requests of
    the scenario get that release; requests already running finish on theirs) and `unload(release_id)`.
    """

    relays: bool
    model_name: str

    @property
    def release_id(self) -> str: ...

    def submit(self, request: ChatRequest) -> GenerationStream: ...

    def release_for(self, scenario: str | None) -> str: ...

    def count_tokens(self, messages: list[dict]) -> int: ...

    def info(self) -> dict: ...

    def close(self) -> None: ...
