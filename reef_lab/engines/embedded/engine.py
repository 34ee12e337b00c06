"""The embedded engine itself: the Engine protocol (submit, info, close) and the releases it serves, over the
scheduler thread (scheduler.py) that runs them.

Releases (live swap): besides the base weights the engine holds any number of loaded releases, each a full model,
and a route per scenario. A request is pinned at `submit` to the release its scenario routes to (or to an explicit
`request.release`); the scheduler keeps one running batch per release and steps each in turn, so a generation's
tokens all come from one set of weights. `route` switches a scenario's new requests at once while requests already
running finish on the release they started with; a release no route names any more is freed when its last row
ends. `load_release` builds the new model beside the serving ones and checks it (every tensor present, same
shapes, finite) before anything points at it, so a broken checkpoint changes nothing.
"""

from __future__ import annotations

import copy
import logging
import threading
from pathlib import Path

import torch

from reef_lab.checkpoints import load_checkpoint
from reef_lab.engines.base import ChatRequest, Generator, ReleaseHost
from reef_lab.engines.embedded.loading import DEFAULT_MODEL_HUB_ID, default_cache_dir, load_model
from reef_lab.engines.embedded.sampling import check_params
from reef_lab.engines.embedded.scheduler import CLOSED, MIN_CHUNK, Scheduler
from reef_lab.engines.embedded.stream import EmbeddedStream
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.engines.tiny import TINY
from reef_lab.errors import EngineUnavailable

log = logging.getLogger("reef_lab.engines.embedded")


class EmbeddedEngine(Generator, ReleaseHost):
    """In-process Engine: one scheduler thread runs the model and batches concurrent requests continuously."""

    def __init__(self, model, tokenizer, model_name: str, release_id: str = "base", max_batch: int = 16,
                 device: str | torch.device | None = None, tool_template: str | None = None,
                 prefill_chunk: int = 512, prefill_share: float = 0.5):
        from transformers import DynamicCache

        _check_mergeable_cache(DynamicCache, model.config)
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if prefill_chunk < 0 or 0 < prefill_chunk < MIN_CHUNK:
            raise ValueError(f"prefill_chunk must be 0 (whole prompts in one step) or at least {MIN_CHUNK} tokens, "
                             f"got {prefill_chunk}")
        if not 0 < prefill_share <= 1:
            raise ValueError(f"prefill_share must be in (0, 1] (1: chunks never shrink), got {prefill_share}")
        self.model_name = model_name
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._model = model.to(self._device).eval()
        self.model_dir: Path | None = None  # the HF folder the base weights came from (trainers start there)
        self.hub_id: str = model_name  # the base model's Hub id, named in release model cards
        self._models: dict[str, object] = {release_id: self._model}  # loaded releases
        self._routes: dict[str, str] = {}  # scenario -> release serving its new requests
        self._retired: set[str] = set()  # releases to free once no row uses them
        self._tokenizer = tokenizer
        self._release_id = release_id
        eos_ids = _eos_ids(model, tokenizer)
        self._chat = ChatTokenizer(tokenizer, min(eos_ids) if eos_ids else None, tool_template)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        self._param_count = sum(p.numel() for p in model.parameters())
        self._cv = threading.Condition()  # guards the releases, the routes and the scheduler's queue
        self._scheduler = Scheduler(self._model, tokenizer, self._models, self._retired, self._cv, eos_ids,
                                    self._max_positions, self._device, max_batch, prefill_chunk, prefill_share,
                                    model_name)
        log.info("engine %s ready on %s (%d params, max_batch %d, release %s)", model_name, self._device,
                 self._param_count, max_batch, release_id)

    @classmethod
    def check_options(cls, options: dict) -> None:
        cls.no_options("embedded", options)

    @classmethod
    def from_config(cls, cfg) -> EmbeddedEngine:
        """`--model-path` (default: the embedded SmolLM2), `--max-batch`, `--tool-template`, `--prefill-chunk`,
        `--prefill-share`. The tiny test model is built into the data dir (`<data_dir>/models`), not the user's
        model cache: it is a throwaway of this deployment."""
        cache = Path(cfg.data_dir) / "models" if cfg.model_path == TINY else default_cache_dir()
        return cls.from_path(cfg.model_path, cache_dir=cache, max_batch=cfg.max_batch,
                             tool_template=cfg.tool_template, prefill_chunk=cfg.prefill_chunk,
                             prefill_share=cfg.prefill_share)

    @classmethod
    def from_path(cls, model_path: str | None = None, cache_dir: Path | str | None = None,
                  dtype: torch.dtype = torch.float32, **kw) -> EmbeddedEngine:
        """Load a model with `load_model` (None: the embedded SmolLM2) and start an engine on it."""
        model, tokenizer, name = load_model(model_path, Path(cache_dir) if cache_dir else default_cache_dir(), dtype)
        engine = cls(model, tokenizer, name, **kw)
        engine.model_dir = Path(getattr(model, "name_or_path", "") or "") or None
        engine.hub_id = DEFAULT_MODEL_HUB_ID if model_path is None else name
        return engine

    # -- the Engine protocol ------------------------------------------------------------------------------------

    @property
    def release_id(self) -> str:
        """The base weights' release id (scenarios without a route are served by it)."""
        return self._release_id

    def release_for(self, scenario: str | None) -> str:
        return self._routes.get(scenario, self._release_id) if scenario else self._release_id

    def load_release(self, release_id: str, folder: str | Path) -> None:
        """Load the checkpoint in `folder` (safetensors, as `save_pretrained` writes them) as `release_id`, beside
        the releases already serving. Raises (and changes nothing) when a tensor is missing, misshapen or not
        finite."""
        if release_id == self._release_id:
            raise ValueError(f"release id {release_id!r} names the base weights")
        model = copy.deepcopy(self._model)  # the close watch comes along (hooks are copied)
        load_checkpoint(model, Path(folder))
        model.to(self._device).eval()
        with self._cv:
            self._models[release_id] = model
            self._retired.discard(release_id)
        log.info("loaded release %s from %s", release_id, folder)

    def route(self, scenario: str, release_id: str) -> None:
        """Serve `scenario`'s new requests with `release_id` (a loaded release or the base); running ones finish on
        the release they started with."""
        with self._cv:
            if release_id not in self._models:
                raise ValueError(f"release {release_id!r} is not loaded: load_release it first")
            old = self._routes.get(scenario)
            if release_id == self._release_id:
                self._routes.pop(scenario, None)
            else:
                self._routes[scenario] = release_id
            if old and old != release_id and old not in self._routes.values():
                self._retired.add(old)
            self._cv.notify()

    def unload(self, release_id: str) -> None:
        """Free a loaded release once no row uses it (refused while a scenario routes to it)."""
        with self._cv:
            if release_id in self._routes.values():
                raise ValueError(f"release {release_id!r} is serving a scenario: route the scenario elsewhere first")
            if release_id in self._models and release_id != self._release_id:
                self._retired.add(release_id)
                self._cv.notify()

    def loaded_releases(self) -> list[str]:
        with self._cv:
            return [k for k in self._models if k not in self._retired]

    @property
    def model(self):
        return self._model

    @property
    def tokenizer(self):
        return self._tokenizer

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_ids(messages))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self._chat.prompt_ids(messages)

    def request_ids(self, request: ChatRequest) -> list[int]:
        return self._chat.request_ids(request)

    def completion_ids(self, text: str) -> list[int]:
        return self._chat.completion_ids(text)

    def vocab_size(self) -> int:
        return self._chat.vocab_size()

    def submit(self, request: ChatRequest) -> EmbeddedStream:
        """Queue a request. Bad parameters or messages raise here, in the caller's thread, and so does a prompt that
        leaves no room in the model's context (the gateway answers that 400 before a stream starts). A prompt that
        fits but leaves less room than max_tokens asks for is served: its answer ends at the context ("length")."""
        check_params(request.params)
        prompt_ids = list(request.prompt_ids) if request.prompt_ids else self._chat.request_ids(request)
        if self._max_positions and len(prompt_ids) >= self._max_positions:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens and max_tokens asks for {request.params.max_tokens} more, "
                f"but {self.model_name} holds at most {self._max_positions} tokens, prompt and answer together: "
                f"shorten the prompt to under {self._max_positions} tokens")
        with self._cv:  # one hold: a release checked here cannot be freed before its stream is queued
            if self._scheduler.closed:
                raise EngineUnavailable(CLOSED)
            release = request.release or self._routes.get(request.scenario, self._release_id)
            if release not in self._models or release in self._retired:
                raise ValueError(f"release {release!r} is not loaded in this engine")
            stream = EmbeddedStream(request, prompt_ids, release)
            self._scheduler.add(stream)
        return stream

    def info(self) -> dict:
        scheduler = self._scheduler
        with self._cv:
            queue_depth = scheduler.queue_depth()
            releases, routes = [k for k in self._models if k not in self._retired], dict(self._routes)
        decoding, prefilling = scheduler.active
        return {
            "engine": "embedded",
            "model_name": self.model_name,
            "release_id": self._release_id,
            "releases_loaded": releases,
            "routes": routes,
            "device": str(self._device),
            "dtype": str(next(self._model.parameters()).dtype).removeprefix("torch."),
            "params": self._param_count,
            "max_batch": self.max_batch,
            "max_positions": self._max_positions,
            "batching": "continuous",
            "prefill_chunk": self.prefill_chunk,
            "prefill_share": scheduler.pacer.share,
            "queue_depth": queue_depth,
            "active_rows": decoding + prefilling,  # requests holding a row: decoding, or prefilling in chunks
            "prefilling_rows": prefilling,
            "running": scheduler.thread.is_alive(),
            **{k if k in ("steps", "tokens_generated", "prefill_chunks", "prefill_chunk_tokens") else f"requests_{k}": v
               for k, v in scheduler.stats.items()},
        }

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the scheduler: requests queued, prefilling or decoding fail with EngineUnavailable (503, retry).

        The scheduler abandons the forward pass in progress at its next layer. If even that takes longer than
        `timeout`, the callers are answered now anyway. A second call returns at once."""
        self._scheduler.close(timeout)

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for value in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(value)
    if not ids:
        log.warning("the model has no EOS token: generations end only at max_tokens or a stop string")
    return ids


def _check_mergeable_cache(cache_class, config) -> None:
    """Merging KV caches by left padding needs plain full-attention layers (no sliding window, no linear state)."""
    kinds = {type(layer).__name__ for layer in cache_class(config=config).layers}
    if kinds - {"DynamicLayer"}:
        raise NotImplementedError(
            f"the embedded engine batches full-attention models only; this model's cache has {sorted(kinds)}: "
            "serve it with vLLM or SGLang instead"
        )
