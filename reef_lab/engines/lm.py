"""Language-model calls for harness recipes (GEPA's task and reflection models), and their record/replay.

GEPA needs plain "messages in, text out" calls to a task model and a reflection model, which may differ: any
OpenAI-compatible endpoint (`OpenAICompatLM`, key from an environment variable) or the embedded engine
(`EngineLM`). Tests must not depend on a model's mood: `RecordingLM` wraps a real model and appends every call to
a JSON-lines cassette; `ReplayLM` answers from the cassette and raises `UnseenCall` for a call it has not seen, so a
change in prompts shows up as a failure instead of silently calling a model.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from reef_lab.schema import check_fields


class LM(Protocol):
    def complete(self, messages: list[dict], **params) -> str: ...


class UnseenCall(KeyError):
    """A replayed LM was asked something its cassette does not hold."""


def call_key(messages: list[dict], params: dict) -> str:
    blob = json.dumps({"messages": messages, "params": params}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class OpenAICompatLM:
    """POST {base_url}/v1/chat/completions; the key comes from the environment variable `key_env`."""

    def __init__(self, base_url: str, model: str, key_env: str = "REEF_UPSTREAM_API_KEY", timeout: float = 120.0,
                 headers: dict[str, str] | None = None):
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model, self.key_env, self.timeout = model, key_env, timeout
        self.headers = headers or {}

    def complete(self, messages: list[dict], **params) -> str:
        body = json.dumps({"model": self.model, "messages": messages, **params}).encode()
        headers = {"Content-Type": "application/json", **self.headers}
        if os.environ.get(self.key_env):
            headers["Authorization"] = f"Bearer {os.environ[self.key_env]}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.url} answered HTTP {e.code}: {e.read()[:300]!r}") from e
        return data["choices"][0]["message"]["content"] or ""


class EngineLM:
    """The embedded engine (or any Engine) as an LM; `release` picks a loaded release, `scenario` the release routed
    to a scenario (its serving weights); neither: the base weights."""

    def __init__(self, engine, release: str | None = None, scenario: str | None = None):
        self.engine, self.release, self.scenario = engine, release, scenario

    def complete(self, messages: list[dict], **params) -> str:
        from reef_lab.engines.base import ChatRequest, SamplingParams

        sp = SamplingParams(**{k: v for k, v in params.items() if k in ("max_tokens", "temperature", "top_p",
                                                                         "stop", "seed")})
        return self.engine.submit(ChatRequest(messages, sp, scenario=self.scenario,
                                              release=self.release)).result().text


class RecordingLM:
    """Calls `inner` and appends {key, messages, params, text} to the cassette."""

    def __init__(self, inner: LM, cassette: str | Path):
        self.inner, self.path = inner, Path(cassette)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def complete(self, messages: list[dict], **params) -> str:
        text = self.inner.complete(messages, **params)
        row = {"key": call_key(messages, params), "messages": messages, "params": params, "text": text}
        with self._lock, open(self.path, "a") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        return text


class ReplayLM:
    """Answers from a cassette; a call not in it raises UnseenCall naming the first message it could not match."""

    def __init__(self, cassette: str | Path):
        self.path = Path(cassette)
        self.answers: dict[str, str] = {}
        for line in self.path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                self.answers[row["key"]] = row["text"]

    def complete(self, messages: list[dict], **params) -> str:
        key = call_key(messages, params)
        if key not in self.answers:
            last = messages[-1]["content"] if messages else ""
            raise UnseenCall(f"{self.path.name} holds no answer for this call (last message: {str(last)[:120]!r}); "
                             "record it again with RecordingLM")
        return self.answers[key]


@dataclass
class LMSpec:
    """The keys of an LM spec (what `make_lm` reads), so a config that names an LM is checked at load."""

    kind: str = field(default="engine", metadata={"help": "engine (the embedded model) or openai (an endpoint)"})
    release: str | None = field(default=None, metadata={"help": "engine: a loaded release to call"})
    base_url: str | None = field(default=None, metadata={"operator": True, "help": "openai: the endpoint"})
    model: str | None = field(default=None, metadata={"help": "openai: the model name"})
    key_env: str = field(default="REEF_UPSTREAM_API_KEY", metadata={"operator": True,
        "help": "openai: env var holding the key"})
    record: str | None = field(default=None, metadata={"operator": True, "help": "append every call to this cassette"})
    replay: str | None = field(default=None, metadata={"operator": True, "help": "answer from this cassette"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.kind not in ("engine", "openai"):
            raise ValueError(f"kind must be 'engine' or 'openai', got {self.kind!r}")
        if self.kind == "openai" and not self.replay and not (self.base_url and self.model):
            raise ValueError("an LM of kind 'openai' needs base_url and model")


def make_lm(spec: dict | None, engine=None) -> LM:
    """An LM from a config mapping: {kind: engine} (the embedded engine; `release` optional) or
    {kind: openai, base_url, model, key_env}; add `record: path` to append every call to a cassette, or
    `replay: path` to answer from one."""
    spec = dict(spec or {"kind": "engine"})
    if spec.get("replay"):
        return ReplayLM(spec["replay"])
    kind = spec.get("kind", "engine")
    if kind == "engine":
        from reef_lab.engines.base import Generator

        if not isinstance(engine, Generator):
            raise ValueError("an LM of kind 'engine' needs a generating engine (the embedded one); with an upstream provider give "
                             "{kind: openai, base_url: ..., model: ...}")
        lm: LM = EngineLM(engine, spec.get("release"))
    elif kind == "openai":
        if not spec.get("base_url") or not spec.get("model"):
            raise ValueError("an LM of kind 'openai' needs base_url and model")
        lm = OpenAICompatLM(spec["base_url"], spec["model"], spec.get("key_env", "REEF_UPSTREAM_API_KEY"))
    else:
        raise ValueError(f"LM kind must be 'engine' or 'openai', got {kind!r}")
    return RecordingLM(lm, spec["record"]) if spec.get("record") else lm
