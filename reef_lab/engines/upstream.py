"""Relay to any OpenAI- or Anthropic-compatible provider.

Bodies and streams pass as they are (only `model` is replaced when the deployment names one), over a pooled
keep-alive connection; when the provider speaks another dialect than the client (`--upstream-dialect`), the gateway
translates them (reef_lab/gateway/relay.py). The client's headers pass by the rules of reef_lab/engines/headers.py. Faults become clear errors and never take the server down: unreachable 502, timeout 504,
provider 5xx 502, provider 4xx relayed with the provider's own body.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import urllib.parse
from dataclasses import dataclass, field
from typing import Iterator

import httptools
import orjson

from reef_lab.engines.base import Relay
from reef_lab.engines.headers import upstream_headers
from reef_lab.errors import UpstreamError


# --upstream-dialect's names for the dialects (reef_lab/wire/dialects.py spells them as records do)
UPSTREAM_DIALECTS = {"anthropic": "anthropic.messages", "openai-chat": "openai.chat",
                     "openai-responses": "openai.responses"}

# Provider headers a client needs to act on an answer (back off, see its quota, quote the provider's request id).
PASSED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "request-id")
PASSED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


@dataclass
class UpstreamReply:
    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)


def passed_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k in PASSED_HEADERS or k.startswith(PASSED_PREFIXES)}


class _Conn:
    """One keep-alive HTTP/1.1 connection; responses are parsed by httptools (llhttp, C) as bytes arrive."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.fresh = True

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True

    def on_body(self, data: bytes) -> None:
        self.chunks.append(data)

    def on_message_complete(self) -> None:
        self.done = True

    def send(self, head: bytes, body: bytes | None) -> None:
        self.status, self.headers, self.chunks = 0, {}, []
        self.head_done = self.done = False
        self.keep_alive = True
        self.parser = httptools.HttpResponseParser(self)
        self.sock.sendall(head + body if body else head)

    def _feed(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            if self.head_done and not self.keep_alive:  # body delimited by the connection's close
                self.done = True
                return False
            raise http.client.RemoteDisconnected("the provider closed the connection before answering")
        self.parser.feed_data(data)
        return True

    def read_head(self) -> None:
        while not self.head_done:
            self._feed()

    def read_body(self) -> bytes:
        while not self.done:
            self._feed()
        return b"".join(self.chunks)

    def iter_body(self) -> Iterator[bytes]:
        while True:
            if self.chunks:
                out, self.chunks = b"".join(self.chunks), []
                yield out
            if self.done or not self._feed():
                if self.chunks:
                    yield b"".join(self.chunks)
                return

    def close(self) -> None:
        self.sock.close()


class _Pool:
    """Keep-alive connections to one origin, reused last-in first-out by any thread.

    A raw socket plus the httptools parser: a proxy hop costs a fraction of what http.client's or urllib3's
    Python-level header parsing costs, and the gateway's added latency is the product. A reused connection that
    the provider closed meanwhile is retried once on a fresh one.
    """

    def __init__(self, base_url: str, connect_timeout: float, read_timeout: float, size: int):
        u = urllib.parse.urlsplit(base_url)
        self.https, self.host = u.scheme == "https", u.hostname or "localhost"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        default_port = self.port == (443 if self.https else 80)
        self.host_header = self.host if default_port else f"{self.host}:{self.port}"
        self.connect_timeout, self.read_timeout, self.size = connect_timeout, read_timeout, size
        self._ssl = ssl.create_default_context() if self.https else None
        self._idle: list[_Conn] = []

    def _new(self) -> _Conn:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            sock = self._ssl.wrap_socket(sock, server_hostname=self.host)
        sock.settimeout(self.read_timeout)
        return _Conn(sock)

    def request(self, method: str, path: str, body: bytes | None, headers: dict) -> _Conn:
        """Send a request and read the status line and headers; the body is read from the returned conn."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}",
                 f"Content-Length: {len(body) if body else 0}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            conn, reused = self._idle.pop(), True
        except IndexError:
            conn, reused = self._new(), False
        while True:
            try:
                conn.send(head, body)
                conn.read_head()
                return conn
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                if not reused:
                    raise
                # The provider closed this idle connection meanwhile (its keep-alive timeout) and answered
                # nothing: as HTTP clients do, send the request again, once, on a new connection.
                conn, reused = self._new(), False

    def release(self, conn: _Conn) -> None:
        if conn.keep_alive and conn.done and len(self._idle) < self.size:
            self._idle.append(conn)
        else:
            conn.close()

    def clear(self) -> None:
        while self._idle:
            self._idle.pop().close()


class UpstreamEngine(Relay):
    """Proxies requests to `base_url` (for example https://api.openai.com or http://127.0.0.1:8000)."""

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, connect_timeout: float = 5.0, pool_size: int = 64,
                 upstream_dialect: str | None = None, key_from_client: bool = False):
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.model_name = model or "upstream"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("REEF_UPSTREAM_API_KEY")
        self.read_timeout = timeout
        self.upstream_dialect = upstream_dialect  # None: each client's own dialect (no translation)
        self.key_from_client = key_from_client
        self.pool = _Pool(self.base_url, connect_timeout, timeout, pool_size)

    @classmethod
    def check_options(cls, options: dict) -> None:
        cls.no_options("upstream", options)

    @classmethod
    def from_config(cls, cfg) -> UpstreamEngine:
        """`--upstream-url`, `--upstream-model`, `--upstream-timeout`, `--upstream-dialect`,
        `--upstream-key-from-client`; the key from REEF_UPSTREAM_API_KEY."""
        if not cfg.upstream_url:
            raise ValueError("the upstream engine needs --upstream-url: the provider to relay to")
        return cls(cfg.upstream_url, cfg.upstream_model, timeout=cfg.upstream_timeout,
                   upstream_dialect=UPSTREAM_DIALECTS[cfg.upstream_dialect] if cfg.upstream_dialect else None,
                   key_from_client=cfg.upstream_key_from_client)

    def _headers(self, path: str, client_headers: dict[str, str]) -> dict[str, str]:
        return upstream_headers(client_headers, path.startswith("/v1/messages"), self.api_key, self.key_from_client)

    def prepare(self, body: dict) -> bytes:
        if self.model:
            body = {**body, "model": self.model}
        return orjson.dumps(body)

    def _request(self, method: str, path: str, data: bytes | None, headers: dict) -> _Conn:
        try:
            return self.pool.request(method, path, data, headers)
        except TimeoutError as e:
            raise UpstreamError(f"the upstream provider at {self.base_url} did not answer within "
                                f"{self.read_timeout}s", status=504) from e
        except (OSError, http.client.HTTPException, httptools.HttpParserError) as e:
            raise UpstreamError(f"the upstream provider at {self.base_url} is unreachable: "
                                f"{type(e).__name__}: {e}") from e

    def _read(self, conn: _Conn) -> bytes:
        try:
            data = conn.read_body()
        except TimeoutError as e:
            conn.close()
            raise UpstreamError(f"the upstream provider at {self.base_url} stalled mid-answer past "
                                f"{self.read_timeout}s", status=504) from e
        except (OSError, http.client.HTTPException, httptools.HttpParserError) as e:
            conn.close()
            raise UpstreamError(f"the upstream answer from {self.base_url} broke off: {e}") from e
        self.pool.release(conn)
        return data

    def forward(self, path: str, body: dict, client_headers: dict[str, str]) -> UpstreamReply:
        conn = self._request("POST", path, self.prepare(body), self._headers(path, client_headers))
        data = self._read(conn)
        self._check_5xx(conn.status, data)
        return UpstreamReply(conn.status, data, conn.headers.get("content-type", "application/json"),
                             passed_headers(conn.headers))

    def get(self, path: str) -> UpstreamReply:
        conn = self._request("GET", path, None, self._headers(path, {}))
        data = self._read(conn)
        self._check_5xx(conn.status, data)
        return UpstreamReply(conn.status, data, conn.headers.get("content-type", "application/json"))

    def _check_5xx(self, status: int, data: bytes) -> None:
        if status >= 500:
            raise UpstreamError(f"the upstream provider at {self.base_url} failed with HTTP {status}: "
                                f"{data[:300].decode(errors='replace')}")

    def open_stream(self, path: str, body: dict, client_headers: dict[str, str]):
        """Start a streaming request. Returns (reply, events): `reply` is the answer's status and passed headers
        with an empty body, and `events` yields raw SSE events (bytes, each ending in a blank line) as they
        arrive; a non-2xx answer comes back whole as (reply with its body, None)."""
        conn = self._request("POST", path, self.prepare(body), self._headers(path, client_headers))
        head = UpstreamReply(conn.status, b"", conn.headers.get("content-type", "application/json"),
                             passed_headers(conn.headers))
        if conn.status >= 300:
            head.body = self._read(conn)
            self._check_5xx(conn.status, head.body)
            return head, None
        return head, self._events(conn)

    def _events(self, conn: _Conn) -> Iterator[bytes]:
        buf, done = b"", False
        try:
            for chunk in conn.iter_body():
                buf += chunk.replace(b"\r\n", b"\n")
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if event.strip():
                        yield event + b"\n\n"
            if buf.strip():
                yield buf + b"\n\n"
            done = True
        except TimeoutError as e:
            raise UpstreamError(f"the upstream stream from {self.base_url} stalled past {self.read_timeout}s",
                                status=504) from e
        except (OSError, http.client.HTTPException, httptools.HttpParserError) as e:
            raise UpstreamError(f"the upstream stream from {self.base_url} broke off: {e}") from e
        finally:
            self.pool.release(conn) if done else conn.close()

    def info(self) -> dict:
        return {"engine": "upstream", "base_url": self.base_url, "model": self.model, "release_id": "upstream",
                "key_set": bool(self.api_key), "dialect": self.upstream_dialect, "key_from_client": self.key_from_client}

    def close(self) -> None:
        self.pool.clear()
