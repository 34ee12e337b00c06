"""An SGLang server as the engine, through SGLang's native HTTP API (written against sglang 0.5.23's source).

Why the native API and not its OpenAI one: `/generate` takes the prompt as token ids and returns every generated
token's id and logprob (`return_logprob`, `meta_info.output_token_logprobs` as `[logprob, token_id, text]`) and
the weight version that produced it, which is what training on the traffic needs. The chat template is applied
here with the base model's tokenizer, so the record's prompt ids are exactly what the server saw.

Releases reach the server by one of two transports (`engine_options.transport`):
- `lora`: each release is a LoRA adapter loaded by name (`/load_lora_adapter`, the release folder's `adapter/`,
  which the trainer writes when it trains with `lora_rank > 0`); a request names its scenario's adapter
  (`lora_path`), so several scenarios and releases serve side by side and a candidate is evaluated beside them;
- `weights`: one set of full weights serves every scenario; routing a scenario to another release pauses the
  server (`/pause_generation`, mode `retract`: running requests go back to the queue, none is lost), loads the
  weights (`/update_weights_from_disk` with the release id as weight version) and continues. Answers carry the
  weight version that produced them, so a record always names its real release.

Launch on a GPU machine: docs/engines.md. Tested here against reef_lab/testing/sglang_server.py, a loopback double
of this wire format.
"""

from __future__ import annotations

import http.client
import logging
import threading
from pathlib import Path

from reef_lab.engines.base import ChatRequest, Generation, Generator, ReleaseHost
from reef_lab.engines.remote import ChatTokenizer, EngineClient, EngineError, ServerStream, ServerTokens

log = logging.getLogger("reef_lab.engines.sglang")

TRANSPORTS = ("lora", "weights")



class SGLangStream(ServerStream):
    """One /generate call: chunks are cumulative text (sglang's default); the last one carries the token ids,
    logprobs and the weight version."""

    def __init__(self, engine: SGLangEngine, body: dict, prompt_ids: list[int], release_id: str):
        self._engine = engine
        super().__init__(engine.client, body, prompt_ids, release_id, "reef-sglang-stream")

    def _read(self, conn: http.client.HTTPConnection) -> Generation:
        last: dict | None = None
        sent = ""
        for chunk in self._client.events(conn, "/generate", self._body):
            if "error" in chunk:
                err = chunk["error"]
                raise EngineError(err.get("message") if isinstance(err, dict) else str(err))
            text = chunk.get("text") or ""
            if text.startswith(sent) and len(text) > len(sent):
                self._put(text[len(sent):])
                sent = text
            last = chunk
        if last is None:
            raise EngineError("the engine ended the stream without an answer")
        generation = self._engine._generation(last, self.prompt_ids, self.release_id)
        if len(generation.text) > len(sent) and generation.text.startswith(sent):
            self._put(generation.text[len(sent):])
        return generation


class SGLangEngine(ServerTokens, Generator, ReleaseHost):
    """Generates through an SGLang server and serves trained releases on it (see the module docstring)."""

    def __init__(self, url: str, model_dir: str | Path, transport: str = "lora", timeout: float = 600.0,
                 model_name: str | None = None, tool_template: str | None = None):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.client = EngineClient(url, timeout)
        self.url, self.transport = self.client.url, transport
        self.model_dir = Path(model_dir)
        self.chat = ChatTokenizer.from_folder(self.model_dir, tool_template)
        self._lock = threading.Lock()
        self._folders: dict[str, Path] = {}  # loaded releases (lora: adapters on the server; weights: on disk)
        self._routes: dict[str, str] = {}
        info = self.client.call("GET", "/model_info")
        self.model_name = model_name or Path(str(info.get("served_model_name") or info.get("model_path"))).name
        self.hub_id = None
        self._base_version = str(info.get("weight_version") or "default")
        self._serving_weights = self._base_version  # weights transport: the release the server holds now

    @classmethod
    def check_options(cls, opts: dict) -> None:
        unknown = set(opts) - {"url", "model_dir", "transport", "timeout", "model_name"}
        if unknown or "url" not in opts:
            raise ValueError(f"the sglang engine takes engine_options url (required), model_dir, transport, timeout, "
                             f"model_name; got {sorted(opts)}")

    @classmethod
    def from_config(cls, cfg) -> SGLangEngine:
        """engine_options: {url: http://host:30000, model_dir: the base model's HF folder (tokenizer, trainer),
        transport: lora | weights, timeout}."""
        opts = cfg.engine_settings()
        cls.check_options(opts)
        return cls(opts["url"], opts.get("model_dir") or cfg.model_path, opts.get("transport", "lora"),
                   float(opts.get("timeout", 600.0)), opts.get("model_name"), cfg.tool_template)

    # ---- generating -----------------------------------------------------------------------------------------
    def submit(self, request: ChatRequest) -> SGLangStream:
        p = request.params
        prompt_ids, release = self.request_tokens(request)
        sampling = {"max_new_tokens": p.max_tokens, "temperature": p.temperature, "top_p": p.top_p}
        if p.stop:
            sampling["stop"] = list(p.stop)
        if p.seed is not None:
            sampling["sampling_seed"] = p.seed  # honoured by servers started with --enable-deterministic-inference
        body = {"input_ids": prompt_ids, "sampling_params": sampling, "return_logprob": True, "stream": True}
        if release != "base" and release not in self._folders:
            raise ValueError(f"release {release!r} is not loaded in this engine")
        if self.transport == "weights":
            self._hold(release)  # one set of weights serves everything: a request for another release swaps them
        elif release != "base":
            body["lora_path"] = release  # sglang reads it as the adapter's name
        return SGLangStream(self, body, prompt_ids, release)

    def _generation(self, chunk: dict, prompt_ids: list[int], release: str) -> Generation:
        meta = chunk.get("meta_info") or {}
        entries = meta.get("output_token_logprobs") or []
        ids = chunk.get("output_ids") or [e[1] for e in entries]
        logprobs = [float(e[0]) if e[0] is not None else 0.0 for e in entries]
        if len(logprobs) != len(ids):
            raise EngineError(f"the engine returned {len(ids)} tokens but {len(logprobs)} logprobs")
        fin = meta.get("finish_reason") or {}
        kind = fin.get("type") if isinstance(fin, dict) else fin
        if kind == "abort":
            raise EngineError(f"the engine aborted the request: {fin.get('message')}")
        stop = fin.get("matched") if isinstance(fin, dict) and isinstance(fin.get("matched"), str) else None
        version = meta.get("weight_version")
        if self.transport == "weights" and version is not None:
            release = "base" if version == self._base_version else str(version)  # what really produced it
        return Generation(text=chunk.get("text") or "", token_ids=list(ids), logprobs=logprobs,
                          prompt_token_ids=prompt_ids, finish_reason="length" if kind == "length" else "stop",
                          release_id=release, stop_sequence=stop)

    # ---- releases -------------------------------------------------------------------------------------------
    def load_release(self, release_id: str, folder: str | Path) -> None:
        folder = Path(folder)
        if self.transport == "lora":
            adapter = folder / "adapter"
            if not (adapter / "adapter_config.json").is_file():
                raise ValueError(f"release folder {folder} holds no LoRA adapter (adapter/): train with "
                                 "trainer.lora_rank > 0, or serve with transport 'weights'")
            self.client.call("POST", "/load_lora_adapter", {"lora_name": release_id, "lora_path": str(adapter)})
        elif not any(folder.glob("*.safetensors")):
            raise ValueError(f"release folder {folder} holds no safetensors weights")
        with self._lock:
            self._folders[release_id] = folder

    def route(self, scenario: str, release_id: str) -> None:
        if release_id != "base" and release_id not in self._folders:
            raise ValueError(f"release {release_id!r} is not loaded: load_release it first")
        if self.transport == "weights":
            self._hold(release_id)
        with self._lock:
            if release_id == "base":
                self._routes.pop(scenario, None)
            else:
                self._routes[scenario] = release_id

    def _hold(self, release_id: str) -> None:
        """Weights transport: make the server hold `release_id`'s weights (pause, load, continue)."""
        with self._lock:
            if self._serving_weights == release_id:
                return
            folder = self.model_dir if release_id == "base" else self._folders[release_id]
            version = self._base_version if release_id == "base" else release_id
            self.client.call("POST", "/pause_generation", {"mode": "retract"})
            try:
                self.client.call("POST", "/update_weights_from_disk",
                                 {"model_path": str(folder), "weight_version": version, "flush_cache": True})
                self._serving_weights = release_id
            finally:
                self.client.call("POST", "/continue_generation", {})

    def unload(self, release_id: str) -> None:
        with self._lock:
            if release_id in self._routes.values():
                raise ValueError(f"release {release_id!r} is serving a scenario: route the scenario elsewhere first")
            folder = self._folders.pop(release_id, None)
        if folder is not None and self.transport == "lora":
            self.client.call("POST", "/unload_lora_adapter", {"lora_name": release_id})

    def loaded_releases(self) -> list[str]:
        with self._lock:
            return ["base", *self._folders]

    # ---- the rest -------------------------------------------------------------------------------------------
    def healthy(self) -> bool:
        """One-token generation on the server (GET /health_generate)."""
        return self.client.ok("/health_generate")

    def info(self) -> dict:
        with self._lock:
            return {"engine": "sglang", "url": self.url, "model_name": self.model_name, "transport": self.transport,
                    "releases_loaded": ["base", *self._folders], "routes": dict(self._routes),
                    "weights_serving": self._serving_weights if self.transport == "weights" else None}

    def close(self) -> None:
        return None  # the server is not ours to stop
