"""Inference: a provider-format request in, the engine's answer out, every call a durable record first.

One path for HTTP and in-process callers: `infer` returns the provider's reply (server/hot.py writes it out),
`infer_record` returns the stored record itself (experiments, TTT rollouts, held-out evaluation), so an in-process
caller never reads back what it just wrote. Each call is an object of its own: a `GenerationCall` (generation.py:
an engine that makes its own tokens, recorded with token ids and logprobs) or a `RelayCall` (relay.py: an upstream
provider, the body passed through and what came back recorded, streams included).
The scenario's serving harness, when it has one, is applied to what the engine sees; the record keeps the body as
the client sent it.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import orjson

from reef_lab.harness import tree as harness_mod
from reef_lab.engines.base import Engine, Relay
from reef_lab.errors import BadRequest, NotFound, ReefError
from reef_lab.gateway import episodes, unanswered
from reef_lab.gateway.generation import GenerationCall
from reef_lab.wire import dialects, text
from reef_lab.gateway.relay import PATHS, RelayCall
from reef_lab.records.record import inference_record
from reef_lab.gateway.replies import COMPONENTS_HEADER, RECEIPT_HEADER, RELEASE_HEADER, Reply, StreamReply, \
    release_header_values
from reef_lab.scenarios import check_name

__all__ = ["Inference", "Relaying", "Reply", "StreamReply", "RECEIPT_HEADER", "RELEASE_HEADER", "COMPONENTS_HEADER",
           "PATHS", "inference_record", "release_header_values"]


class Relaying:
    """Pass a body to an upstream provider, translated when it speaks another dialect (reef_lab/gateway/relay.py);
    every call, failed or not, streaming or not, becomes a record. Shared by the primary's Inference and a relay
    worker (server/workers.py RelayGateway), which writes its own log."""

    def __init__(self, engine: Relay, store):
        self.engine, self.store = engine, store

    def relay(self, dialect: str, body: dict, name: str, tags: dict, headers: dict, sent: dict,
              release: str, components: dict | None = None, caller: str | None = None) -> Reply | StreamReply:
        return RelayCall(self.engine, self.store, dialect, body, name, tags, headers, sent, release,
                         time.perf_counter(), components, caller).run()


class Inference:
    """Serves a scenario's requests. `serving(name)` gives what serves it besides the engine's own routing: the
    harness release (id, files) and the composite release's components, or None (reef_lab.publishing.releaser)."""

    def __init__(self, engine: Engine, store, scenarios, serving: Callable[[str], Any]):
        self.engine, self.store, self.scenarios, self._serving = engine, store, scenarios, serving
        self.started_at = time.time()
        self._relaying = Relaying(engine, store) if isinstance(engine, Relay) else None

    def infer(self, dialect: str, body: Any, scenario: str | None, tags: dict[str, str] | None = None,
              client_headers: dict[str, str] | None = None, release: str | None = None,
              kind: str = "inference", caller: str | None = None, harness: bool = True,
              creator: str | None = None) -> Reply | StreamReply:
        """`release` and `kind` (in-process callers only, never HTTP): answer with that loaded release instead of
        the scenario's routing, recorded as that kind (a candidate's held-out evaluation: `eval`). `caller`: the id
        of the client's token (reef_lab/tenants.py), kept on the record; an episode is its token's own. `harness`
        False (in-process): the serving harness is not applied (a candidate that will serve without it, judged).
        `creator`: the scoped token a new scenario counts against (reef_lab.scenarios.ScenarioLimits)."""
        try:
            name = check_name(scenario)
        except BadRequest as e:
            unanswered.log_unrecorded(dialect, "no valid scenario", e)
            raise
        t0, episode = time.perf_counter(), None
        self.scenarios.ensure(name, creator)  # a new name creates the scenario, refused request or not
        try:  # [episodes hook] a 4xx below is recorded as refused (reef_lab/gateway/unanswered.py)
            episode = episodes.detect(client_headers, body)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            serving = self._serving(name)
            serving_harness = serving.harness if serving is not None else None
            components = serving.components if serving is not None else None
            installed = harness_mod.installed_release(name, client_headers)  # the client carries it (harness/install)
            sent = dialects.with_system(dialect, body, serving_harness[1].system) \
                if serving_harness and harness and not installed else body
            label = serving.release_id if serving is not None and serving.release_id else None
            if installed and serving_harness and not components:  # the record names the release the client carries
                label = installed
            if self._relaying is not None:
                return self._relaying.relay(dialect, body, name, tags or {}, client_headers or {}, sent,
                                            label or "upstream", components, caller)
            return GenerationCall(self.engine, self.store, dialect, body, name, tags or {}, sent, label, components,
                                  release, kind, episode, caller).run()
        except ReefError as e:
            if not unanswered.is_refusal(e) or kind != "inference":
                raise
            unanswered.record_refused(self.store, name, dialect, body, tags or {}, t0, e, episode, caller=caller)
            raise

    def infer_record(self, body: dict, scenario: str, tags: dict[str, str] | None = None,
                     release: str | None = None, kind: str = "inference", session: str | None = None,
                     harness: bool = True) -> dict:
        """One chat completion, not streamed, for an in-process caller: the stored record (response, token ids,
        logprobs, the release that served it). A failed generation raises, its error kept in a record too.
        `session`: the episode the call belongs to (as the x-reef-session header would say); `harness`: as infer's."""
        headers = {episodes.SESSION_HEADER: session} if session else None
        reply = self.infer(dialects.OPENAI_CHAT, {**body, "stream": False}, scenario, tags, client_headers=headers,
                           release=release, kind=kind, harness=harness)
        return reply.record

    def answer(self, scenario: str, release: str, messages: list, max_tokens: int, tags: dict,
               tools: list[dict] | None = None, harness: bool = True) -> dict:
        """A greedy answer of a loaded release, recorded as kind `eval` (the releaser's held-out evaluation): the
        assistant message in OpenAI chat shape (content, and tool_calls when `tools` were offered and it calls them)."""
        body = {"model": self.engine.model_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
        rec = self.infer_record({**body, **({"tools": tools} if tools else {})}, scenario, tags, release=release,
                                kind="eval", harness=harness)
        return text.chat_message(rec)

    def count_tokens(self, body: Any, client_headers: dict[str, str] | None = None) -> Reply:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object {model, messages, system?, tools?}")
        if isinstance(self.engine, Relay):
            if self.engine.upstream_dialect not in (None, dialects.ANTHROPIC):
                raise NotFound("token counting is an Anthropic API; the upstream provider speaks "
                               f"{self.engine.upstream_dialect}, which has none")
            up = self.engine.forward("/v1/messages/count_tokens", body, client_headers or {})
            return Reply(up.status, up.body, up.content_type)
        messages = dialects.parse_count_tokens(body)
        return Reply(200, orjson.dumps({"input_tokens": self.engine.count_tokens(messages)}))

    def models(self) -> Reply:
        if isinstance(self.engine, Relay) and not self.engine.model:
            up = self.engine.get("/v1/models")
            return Reply(up.status, up.body, up.content_type)
        m = self.engine.model_name
        return Reply(200, orjson.dumps({"object": "list", "data": [
            {"id": m, "object": "model", "created": int(self.started_at), "owned_by": "reef_lab",
             "type": "model", "display_name": m, "created_at": time.strftime(
                 "%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at))}]}))

