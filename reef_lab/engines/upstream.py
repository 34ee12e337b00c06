"""Relay to any OpenAI- or Anthropic-compatible provider.

Bodies and streams pass as they are (only `model` is replaced when the deployment names one), over a pooled
keep-alive connection. Faults become clear errors and never take the server down: unreachable 502, timeout 504,
provider 5xx 502, provider 4xx relayed with the provider's own body.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import orjson
import urllib3

from reef_lab.errors import UpstreamError

ANTHROPIC_VERSION = "2023-06-01"


@dataclass
class UpstreamReply:
    status: int
    body: bytes
    content_type: str


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
        self.timeout = urllib3.Timeout(connect=connect_timeout, read=timeout)
        self.pool = urllib3.PoolManager(maxsize=pool_size, block=False, retries=False)

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

    def _request(self, method: str, path: str, data: bytes | None, headers: dict, stream: bool):
        url = self.base_url + path
        try:
            return self.pool.request(method, url, body=data, headers=headers, timeout=self.timeout,
                                     preload_content=not stream, redirect=False)
        except urllib3.exceptions.NewConnectionError as e:  # a subclass of ConnectTimeoutError in urllib3 2
            raise UpstreamError(f"the upstream provider at {self.base_url} is unreachable: {e}") from e
        except urllib3.exceptions.TimeoutError as e:
            raise UpstreamError(f"the upstream provider at {self.base_url} did not answer within "
                                f"{self.timeout.read_timeout}s ({type(e).__name__})", status=504) from e
        except urllib3.exceptions.HTTPError as e:
            raise UpstreamError(f"the upstream provider at {self.base_url} is unreachable: {e}") from e

    def forward(self, path: str, body: dict, client_headers: dict[str, str]) -> UpstreamReply:
        r = self._request("POST", path, self.prepare(body), self._headers(path, client_headers), stream=False)
        self._check_5xx(r.status, r.data)
        return UpstreamReply(r.status, r.data, r.headers.get("Content-Type", "application/json"))

    def get(self, path: str) -> UpstreamReply:
        r = self._request("GET", path, None, self._headers(path, {}), stream=False)
        self._check_5xx(r.status, r.data)
        return UpstreamReply(r.status, r.data, r.headers.get("Content-Type", "application/json"))

    def _check_5xx(self, status: int, data: bytes) -> None:
        if status >= 500:
            raise UpstreamError(f"the upstream provider at {self.base_url} failed with HTTP {status}: "
                                f"{data[:300].decode(errors='replace')}")

    def open_stream(self, path: str, body: dict, client_headers: dict[str, str]):
        """Start a streaming request. Returns (status, events) where events yields raw SSE events (bytes,
        each ending in a blank line) as they arrive; a non-2xx answer comes back as (status, [body])."""
        r = self._request("POST", path, self.prepare(body), self._headers(path, client_headers), stream=True)
        if r.status >= 300:
            data = r.read()
            r.release_conn()
            self._check_5xx(r.status, data)
            return r.status, iter([data])
        return r.status, self._events(r)

    def _events(self, r) -> Iterator[bytes]:
        buf = b""
        try:
            for chunk in r.stream(8192, decode_content=True):
                buf += chunk.replace(b"\r\n", b"\n")
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if event.strip():
                        yield event + b"\n\n"
            if buf.strip():
                yield buf + b"\n\n"
        except urllib3.exceptions.TimeoutError as e:
            raise UpstreamError(f"the upstream stream from {self.base_url} stalled past "
                                f"{self.timeout.read_timeout}s", status=504) from e
        except urllib3.exceptions.HTTPError as e:
            raise UpstreamError(f"the upstream stream from {self.base_url} broke off: {e}") from e
        finally:
            r.release_conn()

    def info(self) -> dict:
        return {"kind": "upstream", "base_url": self.base_url, "model": self.model, "release_id": "upstream",
                "key_set": bool(self.api_key)}

    def close(self) -> None:
        self.pool.clear()
