"""A vLLM server as the engine: started and supervised as a child process (or attached to by URL), generating
through its OpenAI-compatible completions endpoint with the prompt as token ids.

Why completions with token ids: the chat template is applied here with the base model's tokenizer, so the record's
prompt ids are exactly what vLLM saw, and `return_token_ids`, `return_tokens_as_token_ids` and `logprobs: 0` give
every generated token's id and logprob. The server runs with `--logprobs-mode processed_logprobs`, so a logprob is
taken after temperature scaling, as reef_lab's trainer computes it (the DIS ratio compares the two).

vLLM on CPU is its own install (`bash scripts/setup.sh --vllm`: `.venv-vllm`, with the torch and transformers it
pins); the child runs from there. Releases reach it as full weights reloaded in place
(`/pause`, `/collective_rpc reload_weights`, `/reset_prefix_cache`, `/resume`, with `VLLM_SERVER_DEV_MODE=1`):
one release serves every scenario at a time, as with the SGLang engine's `weights` transport. vLLM does not
reload an output layer tied to the embeddings, so a release must leave the embeddings as the base has them:
train with LoRA (`trainer.lora_rank > 0`, whose merged weights change no embedding); `load_release` refuses a
release whose embeddings differ from the base's.
"""

from __future__ import annotations

import http.client
import logging
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

from reef_lab.engines.base import ChatRequest, Generation, Generator, ReleaseHost
from reef_lab.engines.remote import ChatTokenizer, EngineClient, EngineError, message
from reef_lab.errors import EngineUnavailable

log = logging.getLogger("reef_lab.engines.vllm")

DEFAULT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


class VLLMStream:
    """One streamed completion on its own thread: text deltas, then the Generation."""

    def __init__(self, engine: VLLMEngine, body: dict, prompt_ids: list[int], release_id: str):
        self.release_id, self.prompt_ids = release_id, prompt_ids
        self._engine, self._body = engine, body
        self._deltas: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._generation: Generation | None = None
        self._error: BaseException | None = None
        self._conn: http.client.HTTPConnection | None = None
        threading.Thread(target=self._run, name="reef-vllm-stream", daemon=True).start()

    def _run(self) -> None:
        text, ids, logprobs, finish, stop = "", [], [], None, None
        try:
            self._conn = self._engine.client.connection()
            for chunk in self._engine.client.events(self._conn, "/v1/completions", self._body):
                if "error" in chunk:
                    raise EngineError(message(chunk))
                choice = (chunk.get("choices") or [{}])[0]
                delta = choice.get("text") or ""
                if delta:
                    text += delta
                    self._deltas.put(delta)
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
            self._generation = Generation(text=text, token_ids=ids, logprobs=logprobs, prompt_token_ids=self.prompt_ids,
                                          finish_reason="length" if finish == "length" else "stop",
                                          release_id=self.release_id, stop_sequence=stop)
        except (OSError, http.client.HTTPException) as e:  # the server went away mid-answer
            self._error = EngineUnavailable(f"the vLLM engine failed during the answer ({e}); retry shortly")
        except BaseException as e:  # noqa: BLE001 - handed to the caller through result() and iteration
            self._error = e
        finally:
            if self._conn is not None:
                self._conn.close()
            self._done.set()
            self._deltas.put(None)

    def __iter__(self) -> Iterator[str]:
        while (delta := self._deltas.get()) is not None:
            yield delta
        if self._error is not None:
            raise self._error

    def result(self, timeout: float | None = None) -> Generation:
        if not self._done.wait(timeout):
            raise TimeoutError("the engine has not finished this generation")
        if self._error is not None:
            raise self._error
        return self._generation

    def cancel(self) -> None:
        conn = self._conn
        if conn is not None and conn.sock is not None:
            conn.sock.close()


class VLLMEngine(Generator, ReleaseHost):
    """Generates through a vLLM server and serves trained releases on it (see the module docstring)."""

    def __init__(self, model_dir: str | Path, url: str | None = None, python: str | Path | None = None,
                 port: int = 8941, threads_bind: str | None = None, kv_cache_gib: int = 2,
                 max_model_len: int = 2048, start_timeout: float = 600.0, timeout: float = 600.0):
        self.model_dir = Path(model_dir)
        self.chat = ChatTokenizer.from_folder(self.model_dir)
        self._lock = threading.RLock()
        self._folders: dict[str, Path] = {}
        self._routes: dict[str, str] = {}
        self._serving = "base"
        self._process: subprocess.Popen | None = None
        self._log_file = None
        if url is None:
            url = self._launch(Path(python or DEFAULT_PYTHON), port, threads_bind, kv_cache_gib, max_model_len,
                               start_timeout)
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
    def from_config(cls, cfg) -> VLLMEngine:
        """--model-path: the base model's HF folder (default: the embedded SmolLM2's converted folder);
        engine_options: {url (attach instead of starting one), python, port, threads_bind, kv_cache_gib,
        max_model_len, start_timeout, timeout}."""
        opts = cfg.engine_settings()
        allowed = {"url", "python", "port", "threads_bind", "kv_cache_gib", "max_model_len", "start_timeout",
                   "timeout", "model_dir"}
        if set(opts) - allowed:
            raise ValueError(f"the vllm engine's engine_options are {sorted(allowed)}; got {sorted(opts)}")
        model_dir = opts.pop("model_dir", None) or cfg.model_path
        if model_dir is None:
            from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
            model_dir = default_cache_dir() / DEFAULT_MODEL_NAME
            if not (model_dir / "config.json").is_file():
                raise ValueError(f"{model_dir} holds no converted model yet: start the embedded engine once, or "
                                 "give --model-path (a transformers folder)")
        return cls(model_dir, **opts)

    # ---- the child process ----------------------------------------------------------------------------------
    def _launch(self, python: Path, port: int, threads_bind: str | None, kv_cache_gib: int, max_model_len: int,
                start_timeout: float) -> str:
        if not python.is_file():
            raise ValueError(f"no vLLM install at {python}: run `bash scripts/setup.sh --vllm`, or give "
                             "engine_options {python: ...} or {url: ...} for a running server")
        cpus = sorted(os.sched_getaffinity(0))
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(int(kv_cache_gib)),
               "VLLM_CPU_OMP_THREADS_BIND": threads_bind or f"{cpus[0]}-{cpus[-1]}"}  # the default binds one core
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
               "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", str(max_model_len), "--logprobs-mode", "processed_logprobs",
               "--gpu-memory-utilization", "0.2"]
        self._cmd, self._env = cmd, env
        self._start_child()
        return f"http://127.0.0.1:{port}"

    def _start_child(self) -> None:
        log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"reef-vllm-{os.getpid()}.log"
        self._log_file = open(log_path, "ab")
        log.info("starting vLLM: %s (log %s)", " ".join(self._cmd), log_path)
        self._process = subprocess.Popen(self._cmd, env=self._env, stdout=self._log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)

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
                with self._lock:
                    want, self._serving = self._serving, "base"
                    if want != "base":
                        self._hold(want)
                self.restarts += 1
                missed = 0
                log.info("vLLM is back (restart %d), serving %s", self.restarts, self._serving)
            except Exception:  # noqa: BLE001 - tried again at the next check
                log.exception("restarting vLLM failed; trying again")
            finally:
                if self._process is not None and self._process.poll() is None:
                    self._up.set()

    def _kill(self) -> None:
        import signal

        if self._process is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._process.wait()
        if self._log_file is not None:
            self._log_file.close()

    def healthy(self) -> bool:
        return self.client.ok("/health")

    # ---- generating -----------------------------------------------------------------------------------------
    @property
    def release_id(self) -> str:
        return "base"

    def release_for(self, scenario: str | None) -> str:
        return self._routes.get(scenario, "base") if scenario else "base"

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.chat.prompt_ids(messages)

    def completion_ids(self, text: str) -> list[int]:
        return self.chat.completion_ids(text)

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_ids(messages))

    def submit(self, request: ChatRequest) -> VLLMStream:
        p = request.params
        if p.max_tokens < 1 or not 0 <= p.temperature <= 2 or not 0 < p.top_p <= 1:
            raise ValueError("max_tokens must be >= 1, temperature in [0, 2], top_p in (0, 1]")
        prompt_ids = list(request.prompt_ids) if request.prompt_ids else self.prompt_ids(request.messages)
        release = request.release or self.release_for(request.scenario)
        if release != "base" and release not in self._folders:
            raise ValueError(f"release {release!r} is not loaded in this engine")
        if not self._up.is_set():
            raise EngineUnavailable("the vLLM engine is restarting after a failure; retry in a few seconds")
        self._hold(release)
        body = {"model": self._served, "prompt": prompt_ids, "max_tokens": p.max_tokens,
                "temperature": p.temperature, "top_p": p.top_p, "logprobs": 0, "return_token_ids": True,
                "return_tokens_as_token_ids": True, "stream": True}
        if p.stop:
            body["stop"] = list(p.stop)
        if p.seed is not None:
            body["seed"] = p.seed
        return VLLMStream(self, body, prompt_ids, release)

    # ---- releases -------------------------------------------------------------------------------------------
    def load_release(self, release_id: str, folder: str | Path) -> None:
        folder = Path(folder)
        if not any(folder.glob("*.safetensors")):
            raise ValueError(f"release folder {folder} holds no safetensors weights")
        _check_same_embeddings(self.model_dir, folder)
        with self._lock:
            self._folders[release_id] = folder

    def route(self, scenario: str, release_id: str) -> None:
        if release_id != "base" and release_id not in self._folders:
            raise ValueError(f"release {release_id!r} is not loaded: load_release it first")
        self._hold(release_id)
        with self._lock:
            if release_id == "base":
                self._routes.pop(scenario, None)
            else:
                self._routes[scenario] = release_id

    def _hold(self, release_id: str) -> None:
        """Make the server hold `release_id`'s weights: pause (waiting for running requests), reload in place,
        drop the prefix cache (its entries came from the old weights), resume."""
        with self._lock:
            if self._serving == release_id:
                return
            folder = self.model_dir if release_id == "base" else self._folders[release_id]
            started = time.perf_counter()
            self.client.call("POST", "/pause?wait_for_inflight_requests=true")
            try:
                self.client.call("POST", "/collective_rpc", {"method": "reload_weights",
                                                       "kwargs": {"weights_path": str(folder)}})
                self.client.call("POST", "/reset_prefix_cache")
                self._serving = release_id
            finally:
                self.client.call("POST", "/resume")
            log.info("vLLM now holds %s (%.2f s)", release_id, time.perf_counter() - started)

    def unload(self, release_id: str) -> None:
        with self._lock:
            if release_id in self._routes.values():
                raise ValueError(f"release {release_id!r} is serving a scenario: route the scenario elsewhere first")
            self._folders.pop(release_id, None)

    def loaded_releases(self) -> list[str]:
        with self._lock:
            return ["base", *self._folders]

    def info(self) -> dict:
        with self._lock:
            return {"engine": "vllm", "url": self.url, "model_name": self.model_name,
                    "releases_loaded": ["base", *self._folders], "routes": dict(self._routes),
                    "weights_serving": self._serving,
                    "child_pid": self._process.pid if self._process is not None else None}

    def close(self) -> None:
        self._closing = True
        if self._process is not None and self._process.poll() is None:
            import signal

            os.killpg(self._process.pid, signal.SIGTERM)
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait()
        if self._log_file is not None:
            self._log_file.close()


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
