"""A vLLM server as the engine: started and supervised as a child process (or attached to by URL), generating
through its OpenAI-compatible completions endpoint with the prompt as token ids.

Why completions with token ids: the chat template is applied here with the base model's tokenizer, so the record's
prompt ids are exactly what vLLM saw, and `return_token_ids`, `return_tokens_as_token_ids` and `logprobs: 0` give
every generated token's id and logprob. The server runs with `--logprobs-mode processed_logprobs`, so a logprob is
taken after temperature scaling, as reef_lab's trainer computes it (the DIS ratio compares the two).

vLLM on CPU is its own install (`bash scripts/setup.sh --vllm`: `.venv-vllm`, with the torch and transformers it
pins); the child runs from there. Releases reach it by one of two transports (`engine_options.transport`):

- `weights` (the default on CPU, where LoRA generates about 4x slower): one set of full weights at a time, reloaded in
  place (`/pause?mode=keep&clear_cache=true`, `/collective_rpc reload_weights`, `/resume`, `VLLM_SERVER_DEV_MODE=1`).
  A request holds a lease on the weights it was pinned to until it finishes; switching to another release waits for
  the leases to drain while new requests for the old weights queue behind the switch, so every answer comes from the
  weights its record names. Scenarios on different releases (or a candidate under evaluation) take turns, a swap
  (about 1 s) at each turn. vLLM does not reload an output layer tied to the embeddings, so a release must leave the
  embeddings as the base has them: train with LoRA (`trainer.lora_rank > 0`, whose merged weights change no
  embedding); `load_release` refuses other releases and any whose tensors differ in name, shape or size from the base.
  A reload the server refuses puts the previous weights back (or restarts the server), so serving carries on.
- `lora`: each release is its LoRA adapter (the release's `adapter/`) loaded by name (`/v1/load_lora_adapter`,
  `--enable-lora`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`); a request names its release's adapter as the model, so
  scenarios, releases and candidates serve side by side and the base weights never change. Once an adapter is
  loaded, base requests go through a zero adapter (`reef-base`, every weight 0: the base's outputs): vLLM CPU 0.32
  gives requests without an adapter the wrong logprobs (off by up to 1.8 nats) when they share a batch with adapter
  requests after another adapter has served; adapters among themselves batch correctly
  (scripts/studies/probe_vllm_lora_batching.py shows both).

Training beside it: a server started here shares this machine's CPUs with the trainer, and its threads kept the
cores while a step ran. So the learner holds `training_step()` around each step and the server is paused meanwhile
(`/pause?mode=keep`: running and arriving requests wait with their KV cache, and go on at `/resume`); a paused
server uses about 1% of a CPU (results/train-beside-vllm.md). The server, its EngineCore and its workers die with
this process, `kill -9` included (reef_lab.procs).
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

from reef_lab.engines.base import ChatRequest, Generation, Generator, ReleaseHost, YieldsToTraining
from reef_lab.engines.remote import ChatTokenizer, EngineClient, EngineError, ServerStream, ServerTokens, message
from reef_lab.errors import EngineUnavailable
from reef_lab.procs import Popen

log = logging.getLogger("reef_lab.engines.vllm")

DEFAULT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
TRANSPORTS = ("weights", "lora")
ZERO_ADAPTER = "reef-base"
# A training step's pause: running and arriving requests stay queued with their KV cache, and the prefix cache is
# kept (vLLM clears it by default, which only costs the prompts' recomputation at /resume)
STEP_PAUSE = "keep&clear_cache=false"
# A weight switch's pause: the same freeze, and the prefix cache dropped (its entries came from the old weights)
SWITCH_PAUSE = "keep&clear_cache=true"


class WeightsGate:
    """Which weights the server holds, and the requests using them (the `weights` transport).

    A request leases the weights of its release for as long as it runs. A request for other weights claims the
    switch (one at a time); from then on new requests for the held weights wait, and once the last lease is returned
    the claimer swaps and every request waiting for the new weights goes on. Requests for the old weights then claim
    the next switch: releases take turns in batches, none starves."""

    def __init__(self, held: str = "base"):
        self.held, self.leases = held, 0
        self._want: str | None = None  # a claimed switch's target
        self._cond = threading.Condition()

    def acquire(self, release: str, switch) -> None:
        """Lease `release`'s weights, calling `switch(release)` first when the server holds others; a failed switch
        raises here and leaves the held weights as they were."""
        with self._cond:
            while True:
                if self.held == release and self._want is None:
                    self.leases += 1
                    return
                if self.held != release and self._want is None:
                    self._want = release  # claimed: new leases of the held weights wait from now on
                if self._want == release and self.leases == 0 and self.held != release:
                    break
                self._cond.wait()
        try:
            switch(release)
            with self._cond:
                self.held = release
        finally:
            with self._cond:
                self._want = None
                if self.held == release:
                    self.leases += 1
                self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self.leases -= 1
            self._cond.notify_all()

    def reset(self, held: str = "base") -> None:
        """After a restart: the server holds `held`; running requests died with the old server."""
        with self._cond:
            self.held, self.leases, self._want = held, 0, None
            self._cond.notify_all()


class VLLMStream(ServerStream):
    """One streamed /v1/completions call; a weights lease (transport `weights`) is given back when it ends."""

    label = "the vLLM engine"

    def __init__(self, engine: VLLMEngine, body: dict, prompt_ids: list[int], release_id: str, lease: bool):
        self._engine, self._lease = engine, lease
        super().__init__(engine.client, body, prompt_ids, release_id, "reef-vllm-stream")

    def _read(self, conn: http.client.HTTPConnection) -> Generation:
        text, ids, logprobs, finish, stop = "", [], [], None, None
        for chunk in self._client.events(conn, "/v1/completions", self._body):
            if "error" in chunk:
                raise EngineError(message(chunk))
            choice = (chunk.get("choices") or [{}])[0]
            delta = choice.get("text") or ""
            if delta:
                text += delta
                self._put(delta)
            ids += choice.get("token_ids") or []
            logprobs += [0.0 if lp is None else float(lp)
                         for lp in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]
            finish = choice.get("finish_reason") or finish
            stop = choice.get("stop_reason") if isinstance(choice.get("stop_reason"), str) else stop
        if finish is None:
            raise EngineError("the engine ended the stream without finishing the completion")
        if finish == "abort":
            raise EngineError("the engine aborted the request")
        if len(ids) != len(logprobs):
            raise EngineError(f"the engine returned {len(ids)} tokens but {len(logprobs)} logprobs")
        return Generation(text=text, token_ids=ids, logprobs=logprobs, prompt_token_ids=self.prompt_ids,
                          finish_reason="length" if finish == "length" else "stop", release_id=self.release_id,
                          stop_sequence=stop)

    def _finished(self) -> None:
        if self._lease:
            self._engine.gate.release()


class VLLMEngine(ServerTokens, Generator, ReleaseHost, YieldsToTraining):
    """Generates through a vLLM server and serves trained releases on it (see the module docstring)."""

    def __init__(self, model_dir: str | Path, url: str | None = None, python: str | Path | None = None,
                 port: int = 8941, threads_bind: str | None = None, kv_cache_gib: int = 2,
                 max_model_len: int = 2048, start_timeout: float = 600.0, timeout: float = 600.0,
                 transport: str = "weights", max_loras: int = 4, max_lora_rank: int = 64,
                 pause_for_training: bool | None = None, max_pause_s: float = 120.0,
                 tool_template: str | None = None):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self.model_dir, self.transport = Path(model_dir), transport
        self.chat = ChatTokenizer.from_folder(self.model_dir, tool_template)
        self._lock = threading.RLock()
        self._folders: dict[str, Path] = {}
        self._routes: dict[str, str] = {}
        self.gate = WeightsGate("base")
        self._zero: Path | None = None  # lora transport: the zero adapter base requests use (module docstring)
        self._held_folder = self.model_dir  # the weights the server holds (weights transport)
        self._process: Popen | None = None
        self._log_file = None
        self._pause_lock = threading.Lock()
        self._pauses = 0  # training steps and weight switches that hold the server paused now
        # default: pause when the server is ours, so on this machine's CPUs (module docstring)
        self.pause_for_training = url is None if pause_for_training is None else pause_for_training
        # a step paused longer than this lets the server go on beside it: what waits must not outwait `timeout`
        self.max_pause_s = max_pause_s
        if url is None:
            url = self._launch(Path(python or DEFAULT_PYTHON), port, threads_bind, kv_cache_gib, max_model_len,
                               max_loras, max_lora_rank)
        self.client = EngineClient(url, timeout)
        self.url = self.client.url
        self._wait_ready(start_timeout)
        self._start_timeout = start_timeout
        self._up = threading.Event()
        self._up.set()
        self._closing = False
        self.restarts = 0
        if self._process is not None:  # ours to supervise: restarted when it dies or stops answering
            threading.Thread(target=self._supervise, name="reef-vllm-supervisor", daemon=True).start()
        models = self.client.call("GET", "/v1/models").get("data") or [{}]
        self._served = models[0].get("id") or str(self.model_dir)
        self.model_name = self.model_dir.name

    @classmethod
    def check_options(cls, opts: dict) -> None:
        allowed = {"url", "python", "port", "threads_bind", "kv_cache_gib", "max_model_len", "start_timeout",
                   "timeout", "model_dir", "transport", "max_loras", "max_lora_rank", "pause_for_training",
                   "max_pause_s"}
        if set(opts) - allowed:
            raise ValueError(f"the vllm engine's engine_options are {sorted(allowed)}; got {sorted(opts)}")

    @classmethod
    def from_config(cls, cfg) -> VLLMEngine:
        """--model-path: the base model's HF folder (default: the embedded SmolLM2's converted folder);
        engine_options: {transport (weights | lora), url (attach instead of starting one; a lora server needs
        --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1), python, port, threads_bind, kv_cache_gib,
        max_model_len, start_timeout, timeout, max_loras, max_lora_rank, pause_for_training (default: when the
        server is started here), max_pause_s (default 120)}."""
        opts = cfg.engine_settings()
        cls.check_options(opts)
        model_dir = opts.pop("model_dir", None) or cfg.model_path
        if model_dir is None:
            from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
            model_dir = default_cache_dir() / DEFAULT_MODEL_NAME
            if not (model_dir / "config.json").is_file():
                raise ValueError(f"{model_dir} holds no converted model yet: start the embedded engine once, or "
                                 "give --model-path (a transformers folder)")
        return cls(model_dir, **opts, tool_template=cfg.tool_template)

    # ---- the child process ----------------------------------------------------------------------------------
    def _launch(self, python: Path, port: int, threads_bind: str | None, kv_cache_gib: int, max_model_len: int,
                max_loras: int, max_lora_rank: int) -> str:
        if not python.is_file():
            raise ValueError(f"no vLLM install at {python}: run `bash scripts/setup.sh --vllm`, or give "
                             "engine_options {python: ...} or {url: ...} for a running server")
        cpus = sorted(os.sched_getaffinity(0))
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
               "VLLM_CPU_OMP_THREADS_BIND": threads_bind or f"{cpus[0]}-{cpus[-1]}"}  # the default binds one core
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
               "--gpu-memory-utilization", "0.2", "--no-enable-chunked-prefill"]
        if self.transport == "lora":
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
            cmd += ["--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_lora_rank)]
        self._cmd, self._env = cmd, env
        self._start_child()
        return f"http://127.0.0.1:{port}"

    def _start_child(self) -> None:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"reef-vllm-{os.getpid()}.log"
        self._log_file = open(log_path, "ab")
        log.info("starting vLLM: %s (log %s)", " ".join(self._cmd), log_path)
        # through reef_lab.procs: the server, its EngineCore and its workers die with this process, kill -9 included
        self._process = Popen(self._cmd, env=self._env, stdout=self._log_file, stderr=subprocess.STDOUT)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise EngineError(f"vLLM exited with code {self._process.returncode} while starting; see "
                                  f"{self._log_file.name if self._log_file else 'its log'}")
            if self.healthy():
                return
            time.sleep(1.0)
        raise EngineError(f"vLLM at {self.url} was not ready within {timeout:.0f} s")

    def _supervise(self, period: float = 1.0, misses: int = 3) -> None:
        """Restart the child when it exits or fails `misses` health checks in a row (hung); requests meanwhile
        get 503 with a retry hint; afterwards the release that was serving is loaded again."""
        missed = 0
        while not self._closing:
            time.sleep(period)
            if self._closing:
                return
            dead = self._process.poll() is not None
            missed = 0 if (not dead and self.healthy()) else missed + 1
            if not dead and missed < misses:
                continue
            log.error("vLLM %s; restarting it", f"exited with code {self._process.returncode}" if dead else
                      f"failed {missed} health checks")
            self._up.clear()
            try:
                self._kill()
                self._start_child()
                self._wait_ready(self._start_timeout)
                self.gate.reset("base")  # a fresh server holds the base; requests switch weights as they need
                self._held_folder = self.model_dir
                with self._pause_lock:
                    if self._pauses:  # a training step still runs: the fresh server waits for it too
                        self.client.call("POST", f"/pause?mode={STEP_PAUSE}")
                if self.transport == "lora":
                    with self._lock:
                        zero, self._zero = self._zero, None
                        for rid, folder in self._folders.items():
                            self._load_adapter(rid, folder)
                        if zero is not None and self._zero is None:
                            self._zero = zero
                            self.client.call("POST", "/v1/load_lora_adapter", {
                                "lora_name": ZERO_ADAPTER, "lora_path": str(zero / "adapter")})
                self.restarts += 1
                missed = 0
                log.info("vLLM is back (restart %d)", self.restarts)
            except Exception:  # noqa: BLE001 - tried again at the next check
                log.exception("restarting vLLM failed; trying again")
            finally:
                if self._process is not None and self._process.poll() is None:
                    self._up.set()

    def _kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # the server and everything it started
            self._process.wait()
        if self._log_file is not None:
            self._log_file.close()

    def healthy(self) -> bool:
        return self.client.ok("/health")

    # ---- generating -----------------------------------------------------------------------------------------
    def submit(self, request: ChatRequest) -> VLLMStream:
        p = request.params
        prompt_ids, release = self.request_tokens(request)
        if release != "base" and release not in self._folders:
            raise ValueError(f"release {release!r} is not loaded in this engine")
        if not self._up.is_set():
            raise EngineUnavailable("the vLLM engine is restarting after a failure; retry in a few seconds")
        lease = self.transport == "weights"
        if lease:
            self.gate.acquire(release, self._switch)  # returned by the stream when it finishes
        model = self._served
        if self.transport == "lora":
            model = release if release != "base" else (ZERO_ADAPTER if self._zero is not None else self._served)
        body = {"model": model,
                "prompt": prompt_ids, "max_tokens": p.max_tokens,
                "temperature": p.temperature, "top_p": p.top_p, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "stream": True}
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        try:
            return VLLMStream(self, body, prompt_ids, release, lease)
        except BaseException:
            if lease:
                self.gate.release()
            raise

    # ---- releases -------------------------------------------------------------------------------------------
    def load_release(self, release_id: str, folder: str | Path) -> None:
        folder = Path(folder)
        if self.transport == "lora":
            if not (folder / "adapter" / "adapter_config.json").is_file():
                raise ValueError(f"release folder {folder} holds no LoRA adapter (adapter/): train with "
                                 "trainer.lora_rank > 0, or serve with transport 'weights'")
            self._load_adapter(release_id, folder)
        else:
            check_release_weights(self.model_dir, folder)
        with self._lock:
            self._folders[release_id] = folder

    def _load_adapter(self, release_id: str, folder: Path) -> None:
        self.client.call("POST", "/v1/load_lora_adapter", {"lora_name": release_id,
                                                            "lora_path": str(folder / "adapter")})
        if self._zero is None:
            self._zero = _zero_adapter(folder / "adapter")
            self.client.call("POST", "/v1/load_lora_adapter", {"lora_name": ZERO_ADAPTER,
                                                                "lora_path": str(self._zero / "adapter")})

    def route(self, scenario: str, release_id: str) -> None:
        if release_id != "base" and release_id not in self._folders:
            raise ValueError(f"release {release_id!r} is not loaded: load_release it first")
        if self.transport == "weights":  # prove the server takes these weights before any request is routed there
            self.gate.acquire(release_id, self._switch)
            self.gate.release()
        with self._lock:
            if release_id == "base":
                self._routes.pop(scenario, None)
            else:
                self._routes[scenario] = release_id

    def _switch(self, release_id: str) -> None:
        """Weights transport, no request running: reload the server's weights in place, drop the prefix cache
        (its entries came from the old weights). A reload the server refuses puts the held weights back; if even
        that fails, the server is restarted (on the base) by the supervisor."""
        held, held_folder = self.gate.held, self._held_folder
        folder = self.model_dir if release_id == "base" else self._folders[release_id]
        started = time.perf_counter()
        # No lease is out. The pause freezes whatever the server still holds (`keep`), never aborts it: with
        # `abort`, switches made while a training step held the server paused ended requests of the learner's
        # held-out evaluation without a finish ("ended the stream without finishing the completion", seen in CI and
        # in /tmp/reef-vllm logs: a run of abort pauses, one /resume). An abandoned request is ended by vLLM when it
        # sees its client gone. The prefix cache is dropped (its entries came from the old weights).
        self._pause(SWITCH_PAUSE)
        try:
            try:
                self._reload(folder)
                self._held_folder = folder
            except (EngineError, EngineUnavailable) as e:  # refused, or the server died on it
                log.error("vLLM refused the weights of %s (%s); putting %s back", release_id, e, held)
                try:
                    self._reload(held_folder)
                except Exception:  # noqa: BLE001 - a server in an unknown state is restarted
                    log.exception("vLLM could not reload %s either; restarting it", held)
                    self._kill_for_restart()
                raise EngineError(f"the engine refused release {release_id}'s weights: {e}") from e
        finally:
            try:
                self._unpause()
            except Exception:  # noqa: BLE001 - a server that cannot resume is restarted by the supervisor
                log.exception("vLLM did not resume")
        log.info("vLLM now holds %s (%.2f s)", release_id, time.perf_counter() - started)

    def _reload(self, folder: Path) -> None:
        self.client.call("POST", "/collective_rpc", {"method": "reload_weights",
                                                     "kwargs": {"weights_path": str(folder)}})
        try:  # the pause cleared the cache already; this is for servers whose pause does not
            self.client.call("POST", "/reset_prefix_cache")
        except EngineError as e:
            log.warning("vLLM did not reset its prefix cache after the reload (%s); the pause cleared it", e)

    def _kill_for_restart(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    # ---- sharing the CPUs with a trainer -------------------------------------------------------------------
    @contextlib.contextmanager
    def training_step(self):
        """While a training step runs, the server schedules nothing (`/pause?mode=keep`: requests running and
        arriving stay queued, with their KV cache, and go on at `/resume`), so the trainer has the CPUs (a policy
        step beside a generating server took 110 s against 14-25 s beside the embedded engine: issue 28). Off with
        `pause_for_training: false` (a server on other hardware). A step that holds the pause longer than
        `max_pause_s` lets the server go on beside it from then on: on a machine that other work starves, a step took
        11 minutes and requests that waited through it outwaited the stream's `timeout` and failed
        (results/train-beside-vllm.md)."""
        if not self.pause_for_training:
            yield
            return
        try:
            self._pause(STEP_PAUSE)
        except (EngineError, EngineUnavailable) as e:  # a server restarting: the step runs beside it
            log.warning("could not pause vLLM for a training step (%s); training beside it", e)
            paused = False
        else:
            paused = True
        if not paused:
            yield
            return
        owed = threading.Lock()  # held by whoever resumes: the timer or the step's end, once

        def let_go(late: bool) -> None:
            if not owed.acquire(blocking=False):
                return
            if late:
                log.warning("a training step has held vLLM paused for %.0f s; it answers beside the step from now on",
                            self.max_pause_s)
            try:
                self._unpause()
            except Exception:  # noqa: BLE001 - the step goes on either way; the supervisor sees a broken server
                log.exception("vLLM did not resume after a training step")
        timer = threading.Timer(self.max_pause_s, let_go, args=(True,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            let_go(False)

    def _pause(self, mode: str) -> None:
        """Count a holder of the pause: the server is paused by the first (a weight switch pauses again even when a
        step holds it already, to drop the prefix cache) and resumed by the last."""
        with self._pause_lock:
            if self._pauses == 0 or mode != STEP_PAUSE:
                self.client.call("POST", f"/pause?mode={mode}")
            self._pauses += 1

    def _unpause(self) -> None:
        with self._pause_lock:
            self._pauses -= 1
            if self._pauses == 0:
                self.client.call("POST", "/resume")

    def unload(self, release_id: str) -> None:
        with self._lock:
            if release_id in self._routes.values():
                raise ValueError(f"release {release_id!r} is serving a scenario: route the scenario elsewhere first")
            folder = self._folders.pop(release_id, None)
        if folder is not None and self.transport == "lora":
            self.client.call("POST", "/v1/unload_lora_adapter", {"lora_name": release_id})

    def loaded_releases(self) -> list[str]:
        with self._lock:
            return ["base", *self._folders]

    def info(self) -> dict:
        with self._lock:
            return {"engine": "vllm", "url": self.url, "model_name": self.model_name, "transport": self.transport,
                    "releases_loaded": ["base", *self._folders], "routes": dict(self._routes),
                    "weights_serving": self.gate.held if self.transport == "weights" else None,
                    "child_pid": self._process.child_pid if self._process is not None else None}

    def close(self) -> None:
        self._closing = True
        if self._process is not None:
            self._process.stop(timeout=30)  # SIGTERM to the server; its whole tree SIGKILLed after 30 s
        if self._log_file is not None:
            self._log_file.close()


def _zero_adapter(adapter: Path) -> Path:
    """A LoRA adapter shaped like `adapter` with every weight 0 (the base model's outputs), in a fresh folder."""
    import tempfile

    from safetensors.torch import load_file, save_file

    folder = Path(tempfile.mkdtemp(prefix="reef-vllm-zero-")) / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_bytes((adapter / "adapter_config.json").read_bytes())
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    save_file({k: v.new_zeros(v.shape) for k, v in weights.items()}, str(folder / "adapter_model.safetensors"))
    return folder.parent


def check_release_weights(base: Path, folder: Path) -> None:
    """Refuse, before the server sees them, weights that an in-place reload would not apply as a whole: tensors
    missing, extra, of another shape or dtype, or cut short on disk; and changed token embeddings, which vLLM's
    reload does not apply to a tied output layer."""
    from safetensors import safe_open

    def tensors(path: Path) -> dict[str, tuple]:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ValueError(f"release folder {path} holds no safetensors weights")
        out = {}
        for f in files:
            try:
                with safe_open(str(f), "pt") as st:
                    for k in st.keys():
                        sl = st.get_slice(k)
                        out[k] = (tuple(sl.get_shape()), sl.get_dtype())
            except Exception as e:  # noqa: BLE001 - a header that does not parse, or a file cut short
                raise ValueError(f"release weights {f} cannot be read ({e})") from e
        return out
    want, got = tensors(base), tensors(folder)
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise ValueError(f"release {folder} does not have the base model's tensors (differ: {diff[:5]}): the vllm "
                         "engine reloads weights in place and needs the same names, shapes and dtypes")
    _check_same_embeddings(base, folder)


def _check_same_embeddings(base: Path, folder: Path) -> None:
    """vLLM's in-place reload leaves an output layer tied to the embeddings as it was: a release that changed the
    embeddings would serve a model that is neither it nor the base."""
    from safetensors import safe_open

    def embed(path: Path):
        for f in sorted(path.glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    if k.endswith("embed_tokens.weight"):
                        return st.get_tensor(k)
        return None
    a, b = embed(base), embed(folder)
    if a is not None and b is not None and not bool((a == b).all()):
        raise ValueError(f"release {folder} changed the token embeddings, which vLLM's in-place reload does not "
                         "apply to a tied output layer: train with trainer.lora_rank > 0 for the vllm engine")


class PromptScorer:
    """Log-probabilities of given token ids under a model a vLLM OpenAI server serves (a distillation teacher): one
    `/v1/completions` call per sequence, its `prompt` the token ids, `max_tokens` 1 and `prompt_logprobs` k; vLLM
    answers `choices[0].prompt_logprobs`, one entry per prompt token (null for the first), each mapping token ids
    (JSON string keys) to `{logprob, rank, decoded_token}` for the k most likely tokens and the prompt's own token
    (vllm 0.32: entrypoints/openai/completion; raw logits, its default logprobs_mode)."""

    def __init__(self, url: str, model: str | None, timeout: float):
        self.client = EngineClient(url, timeout)
        self.url = self.client.url
        models = [m.get("id") for m in self.client.call("GET", "/v1/models").get("data") or []]
        if not models:
            raise ValueError(f"the server at {url} lists no model (/v1/models)")
        if model is not None and model not in models:
            raise ValueError(f"model {model!r} is not served at {url} (it serves {models})")
        self.model = model or models[0]

    def tokenize(self, text: str) -> list[int]:
        return list(self.client.call("POST", "/tokenize", {"model": self.model, "prompt": text,
                                                           "add_special_tokens": False}).get("tokens") or [])

    def score(self, prompt: list[int], completion: list[int], top_k: int = 0
              ) -> tuple[list[float], list[list[int]], list[list[float]]]:
        """Each completion token's log-probability after everything before it, and with top_k the k most likely
        token ids and their log-probabilities at each completion position (most likely first)."""
        out = self.client.call("POST", "/v1/completions", {
            "model": self.model, "prompt": prompt + completion, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": top_k})
        rows = (out.get("choices") or [{}])[0].get("prompt_logprobs")
        if not isinstance(rows, list) or len(rows) != len(prompt) + len(completion):
            raise ValueError(f"the server at {self.url} gave no prompt_logprobs for the sequence (is it vLLM's "
                             "OpenAI server?)")
        lps, top_ids, top_lps = [], [], []
        for tok, row in zip(completion, rows[len(prompt):], strict=True):
            lps.append(float(row[str(tok)]["logprob"]))
            if top_k:
                best = sorted((v["rank"], int(k), float(v["logprob"])) for k, v in row.items())[:top_k]
                top_ids.append([i for _, i, _ in best])
                top_lps.append([lp for _, _, lp in best])
        return lps, top_ids, top_lps

