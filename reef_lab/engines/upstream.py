"""Relay to any OpenAI- or Anthropic-compatible provider.

Bodies and streams pass as they are (only `model` is replaced when the deployment names one), over a pooled
keep-alive connection. Faults become clear errors and never take the server down: unreachable 502, timeout 504,
provider 5xx 502, provider 4xx relayed with the provider's own body.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Iterator

import orjson

from reef_lab.errors import UpstreamError

ANTHROPIC_VERSION = "2023-06-01"


@dataclass
class UpstreamReply:
    status: int
    body: bytes
    content_type: str


class _Pool:
    """Keep-alive HTTP/1.1 connections to one origin, reused last-in first-out by any thread.

    Plain http.client: a proxy hop costs a third of what urllib3's layers cost, and the gateway's added latency
    is the product. A reused connection that the provider closed meanwhile is retried once on a fresh one.
    """

    def __init__(self, base_url: str, connect_timeout: float, read_timeout: float, size: int):
        u = urllib.parse.urlsplit(base_url)
        self.https, self.host = u.scheme == "https", u.hostname or "localhost"
        self.port = u.port or (443 if self.https else 80)
        self.prefix = u.path.rstrip("/")
        self.connect_timeout, self.read_timeout, self.size = connect_timeout, read_timeout, size
        self._ssl = ssl.create_default_context() if self.https else None
        self._idle: list[http.client.HTTPConnection] = []

    def _new(self) -> http.client.HTTPConnection:
        if self.https:
            c = http.client.HTTPSConnection(self.host, self.port, timeout=self.connect_timeout, context=self._ssl)
        else:
            c = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout)
        c.connect()
        c.sock.settimeout(self.read_timeout)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def request(self, method: str, path: str, body: bytes | None, headers: dict):
        for attempt in (0, 1):
            try:
                conn, reused = self._idle.pop(), True
            except IndexError:
                conn, reused = self._new(), False
            try:
                conn.request(method, self.prefix + path, body=body, headers=headers)
                return conn, conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                conn.close()
                if not reused or attempt:
                    raise
        raise AssertionError("unreachable")

    def release(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        if resp.will_close or len(self._idle) >= self.size:
            conn.close()
        else:
            self._idle.append(conn)

    def clear(self) -> None:
        while self._idle:
            self._idle.pop().close()


class UpstreamEngine:
    """Proxies requests to `base_url` (for example https://api.openai.com or http://127.0.0.1:8000)."""

    relays = True

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0, connect_timeout: float = 5.0, pool_size: int = 64):
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.model_name = model or "upstream"
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("REEF_UPSTREAM_API_KEY")
        self.read_timeout = timeout
        self.pool = _Pool(self.base_url, connect_timeout, timeout, pool_size)

    @property
    def release_id(self) -> str:
        return "upstream"

    def _headers(self, path: str, client_headers: dict[str, str]) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if path.startswith("/v1/messages"):
            h["anthropic-version"] = client_headers.get("anthropic-version") or ANTHROPIC_VERSION
            if client_headers.get("anthropic-beta"):
                h["anthropic-beta"] = client_headers["anthropic-beta"]
            if self.api_key:
                h["x-api-key"] = self.api_key
        elif self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def prepare(self, body: dict) -> bytes:
        if self.model:
            body = {**body, "model": self.model}
        return orjson.dumps(body)

    def _request(self, method: str, path: str, data: bytes | None, headers: dict):
        try:
            return self.pool.request(method, path, data, headers)
        except TimeoutError as e:
            raise UpstreamError(f"the upstream provider at {self.base_url} did not answer within "
                                f"{self.read_timeout}s", status=504) from e
        except (OSError, http.client.HTTPException) as e:
            raise UpstreamError(f"the upstream provider at {self.base_url} is unreachable: "
                                f"{type(e).__name__}: {e}") from e

    def _read(self, conn, resp) -> bytes:
        try:
            data = resp.read()
        except TimeoutError as e:
            conn.close()
            raise UpstreamError(f"the upstream provider at {self.base_url} stalled mid-answer past "
                                f"{self.read_timeout}s", status=504) from e
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise UpstreamError(f"the upstream answer from {self.base_url} broke off: {e}") from e
        self.pool.release(conn, resp)
        return data

    def forward(self, path: str, body: dict, client_headers: dict[str, str]) -> UpstreamReply:
        conn, r = self._request("POST", path, self.prepare(body), self._headers(path, client_headers))
        data = self._read(conn, r)
        self._check_5xx(r.status, data)
        return UpstreamReply(r.status, data, r.getheader("Content-Type", "application/json"))

    def get(self, path: str) -> UpstreamReply:
        conn, r = self._request("GET", path, None, self._headers(path, {}))
        data = self._read(conn, r)
        self._check_5xx(r.status, data)
        return UpstreamReply(r.status, data, r.getheader("Content-Type", "application/json"))

    def _check_5xx(self, status: int, data: bytes) -> None:
        if status >= 500:
            raise UpstreamError(f"the upstream provider at {self.base_url} failed with HTTP {status}: "
                                f"{data[:300].decode(errors='replace')}")

    def open_stream(self, path: str, body: dict, client_headers: dict[str, str]):
        """Start a streaming request. Returns (status, events) where events yields raw SSE events (bytes,
        each ending in a blank line) as they arrive; a non-2xx answer comes back as (status, [body])."""
        conn, r = self._request("POST", path, self.prepare(body), self._headers(path, client_headers))
        if r.status >= 300:
            data = self._read(conn, r)
            self._check_5xx(r.status, data)
            return r.status, iter([data])
        return r.status, self._events(conn, r)

    def _events(self, conn, r) -> Iterator[bytes]:
        lines: list[bytes] = []
        done = False
        try:
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.rstrip(b"\r\n")
                if line:
                    lines.append(line)
                elif lines:
                    yield b"\n".join(lines) + b"\n\n"
                    lines = []
            if lines:
                yield b"\n".join(lines) + b"\n\n"
            done = True
        except TimeoutError as e:
            raise UpstreamError(f"the upstream stream from {self.base_url} stalled past {self.read_timeout}s",
                                status=504) from e
        except (OSError, http.client.HTTPException) as e:
            raise UpstreamError(f"the upstream stream from {self.base_url} broke off: {e}") from e
        finally:
            self.pool.release(conn, r) if done else conn.close()

    def info(self) -> dict:
        return {"kind": "upstream", "base_url": self.base_url, "model": self.model, "release_id": "upstream",
                "key_set": bool(self.api_key)}

    def close(self) -> None:
        self.pool.clear()
