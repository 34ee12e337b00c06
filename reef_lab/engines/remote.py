"""What the engine servers share: the chat template as token ids, the HTTP client, a streamed generation's thread
(ServerStream) and the token side of the engine (ServerTokens); vllm.py and sglang.py add only their wire."""

from __future__ import annotations

import http.client
import queue
import threading
import urllib.parse
from typing import Iterator

import orjson
from jinja2 import TemplateError

from reef_lab.engines.base import ChatRequest, Generation
from reef_lab.engines.tools import has_tool_turns, resolve_tool_template
from reef_lab.extras import need
from reef_lab.errors import EngineUnavailable


class EngineError(RuntimeError):
    """The engine server refused or failed a call; the message is the server's."""


class ChatTokenizer:
    """The base model's chat template and tokenizer, one call at a time: a fast tokenizer is one shared Rust
    object whose calls can refuse to run concurrently ("Already borrowed").

    Requests with tools, or with tool calls and results in their history, are templated with the tool template
    (reef_lab/engines/tools.py: the model's own when it renders tools, else the shipped Hermes-style one, or
    `tool_template`, a file); the others exactly as before, with the model's own template."""

    def __init__(self, tokenizer, eos_id: int | None, tool_template: str | None = None):
        self.tokenizer, self.eos_id = tokenizer, eos_id
        self.tool_template, self.tool_template_origin = resolve_tool_template(tokenizer.chat_template, tool_template)
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None, prefill: str = "") -> list[int]:
        """The chat-templated prompt, ending with the assistant turn's opening (and `prefill`, the text the
        assistant turn starts with: see ToolUse.prefill). A template that refuses the conversation is a ValueError."""
        try:
            with self._lock:
                if not tools and not prefill and not has_tool_turns(messages):
                    encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                 tokenize=True, return_dict=True)
                    return list(encoded["input_ids"])
                # apply_chat_template(tokenize=True) renders, then encodes without special tokens: the same here,
                # with the prefill appended to the rendered text
                text = self.tokenizer.apply_chat_template(messages, tools=tools or None,
                                                          chat_template=self.tool_template,
                                                          add_generation_prompt=True, tokenize=False)
                return list(self.tokenizer.encode(text + prefill, add_special_tokens=False))
        except TemplateError as e:
            raise ValueError(f"the chat template refused the conversation: {e}") from None

    def request_ids(self, request: ChatRequest) -> list[int]:
        """The prompt of a request: its messages, with its tools and tool-choice prefill when it offers tools."""
        tu = request.tool_use
        return self.prompt_ids(request.messages, tu.prompt_tools() if tu else None, tu.prefill() if tu else "")

    def vocab_size(self) -> int:
        """The tokenizer's vocabulary, added tokens included."""
        return len(self.tokenizer)

    def completion_ids(self, text: str) -> list[int]:
        """A target answer's token ids as the model would generate them, ending with EOS (for demonstrations)."""
        with self._lock:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        return list(ids) + ([self.eos_id] if self.eos_id is not None else [])

    @classmethod
    def from_folder(cls, model_dir, tool_template: str | None = None) -> ChatTokenizer:
        need("train", "a remote engine's tokenizer")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        eos = tok.eos_token_id
        return cls(tok, eos if isinstance(eos, int) else (list(eos)[0] if eos else None), tool_template)


class EngineClient:
    """JSON calls and server-sent events to an engine server at `url` (a connection per call)."""

    def __init__(self, url: str, timeout: float):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"engine url must be http://host:port, got {url!r}")
        self.url, self._host, self._port, self.timeout = url.rstrip("/"), parts.hostname, parts.port or 80, timeout

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout or self.timeout)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """A JSON call; EngineError with the server's message when it fails, EngineUnavailable when unreachable."""
        conn = self.connection()
        try:
            conn.request(method, path, body=None if body is None else orjson.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except OSError as e:
            raise EngineUnavailable(f"the engine at {self.url} cannot be reached ({e}); retry shortly") from e
        finally:
            conn.close()
        try:
            out = orjson.loads(data) if data else {}
        except orjson.JSONDecodeError:
            out = {"message": data.decode(errors="replace")}
        if resp.status >= 300 or (isinstance(out, dict) and out.get("success") is False):
            raise EngineError(f"{path} failed with HTTP {resp.status}: {message(out)}")
        return out if isinstance(out, dict) else {"result": out}

    def events(self, conn: http.client.HTTPConnection, path: str, body: dict) -> Iterator[dict]:
        """POST and yield each `data:` event's JSON until `[DONE]`; a 400 is the request's fault (ValueError)."""
        conn.request("POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status >= 300:
            data = resp.read()
            try:
                msg = message(orjson.loads(data))
            except orjson.JSONDecodeError:
                msg = data.decode(errors="replace")
            if resp.status == 400:
                raise ValueError(f"the engine refused the request: {msg}")
            raise EngineError(f"{path} failed with HTTP {resp.status}: {msg}")
        for raw in resp:
            line = raw.strip()
            if line.startswith(b"data:"):
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                yield orjson.loads(data)

    def ok(self, path: str) -> bool:
        """Whether GET `path` answers 200 within 5 s (health checks)."""
        conn = self.connection(5)
        try:
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()


def message(body) -> str:
    """The error message in an engine's JSON answer, whichever shape it has."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message"))
        if err is not None:
            return str(err)
        return str(body.get("message") or body.get("error_message") or body)
    return str(body)


class ServerStream:
    """One streamed generation from an engine server, read on its own thread: text deltas as they arrive, the
    Generation at the end. A subclass reads its server's events (`_read`: put each text delta with `_put`, return
    the Generation); the thread, the errors, cancellation and the iteration are the same for every server."""

    label = "the engine"  # in the message a dropped connection gives

    def __init__(self, client: EngineClient, body: dict, prompt_ids: list[int], release_id: str, thread: str):
        self.release_id, self.prompt_ids = release_id, prompt_ids
        self._client, self._body = client, body
        self._deltas: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._generation: Generation | None = None
        self._error: BaseException | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._cancelled = False
        threading.Thread(target=self._run, name=thread, daemon=True).start()

    def _read(self, conn: http.client.HTTPConnection) -> Generation:
        raise NotImplementedError

    def _finished(self) -> None:
        """Called once the stream ended, however (a subclass lets go of what the request held)."""

    def _put(self, delta: str) -> None:
        self._deltas.put(delta)

    def _run(self) -> None:
        try:
            self._conn = self._client.connection()
            self._generation = self._read(self._conn)
        except (OSError, http.client.HTTPException) as e:  # the server went away mid-answer
            self._error = EngineUnavailable(f"{self.label} failed during the answer ({e}); retry shortly")
        except BaseException as e:  # noqa: BLE001 - handed to the caller through result() and iteration
            self._error = e if not self._cancelled else EngineError("cancelled")
        finally:
            if self._conn is not None:
                self._conn.close()
            self._finished()
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
        self._cancelled = True
        conn = self._conn
        if conn is not None and conn.sock is not None:
            conn.sock.close()  # the server aborts a request whose client went away


class ServerTokens:
    """The token side every engine server shares (vLLM, SGLang): the chat template applied here with the base
    model's tokenizer (`self.chat`), so a record's prompt ids are exactly what the server saw, and scenario routes
    (`self._routes`) naming the release that answers."""

    chat: ChatTokenizer
    _routes: dict[str, str]

    @property
    def release_id(self) -> str:
        return "base"

    def release_for(self, scenario: str | None) -> str:
        return self._routes.get(scenario, "base") if scenario else "base"

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.chat.prompt_ids(messages)

    def request_ids(self, request: ChatRequest) -> list[int]:
        return self.chat.request_ids(request)

    def completion_ids(self, text: str) -> list[int]:
        return self.chat.completion_ids(text)

    def vocab_size(self) -> int:
        return self.chat.vocab_size()

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_ids(messages))

    def request_tokens(self, request: ChatRequest) -> tuple[list[int], str]:
        """(prompt ids, the release that answers) of a request, its sampling checked."""
        p = request.params
        if p.max_tokens < 1 or not 0 <= p.temperature <= 2 or not 0 < p.top_p <= 1:
            raise ValueError("max_tokens must be >= 1, temperature in [0, 2], top_p in (0, 1]")
        prompt_ids = list(request.prompt_ids) if request.prompt_ids else self.chat.request_ids(request)
        return prompt_ids, request.release or self.release_for(request.scenario)
