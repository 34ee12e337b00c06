"""The relay's side of episodes and of nothing unrecorded: calls grouped by the client's own session id, a stream the
client leaves recorded as cancelled with what came until then (same dialect and translated), a provider's 4xx
recorded as refused, each with one log line. Against the scripted provider, through the real server on loopback.
"""

from __future__ import annotations

import logging

import anthropic
import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.testing.scripted_provider import ScriptedProvider
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT
from tests.test_episodes import CLAUDE_USER_ID

SESSION = "3e4b03c7-93a6-4623-ad23-aca368164191"


@pytest.fixture
def provider():
    with ScriptedProvider(speaks=("chat", "messages")) as p:
        yield p


@pytest.mark.parametrize("upstream", [None, OPENAI_CHAT], ids=["same-dialect", "translated"])
def test_a_left_stream_is_recorded_as_cancelled_in_its_episode(serve, provider, upstream, caplog):
    srv = serve(UpstreamEngine(provider.url, timeout=10, upstream_dialect=upstream))
    body = {"model": "claude-x", "max_tokens": 50, "stream": True, "metadata": {"user_id": CLAUDE_USER_ID},
            "messages": [{"role": "user", "content": "Tell me something"}]}
    with caplog.at_level(logging.INFO, logger="reef_lab.gateway.unanswered"):
        # what the HTTP server does when the client hangs up: it closes the events after the ones already sent
        reply = srv.gateway.infer(ANTHROPIC, body, "relay", {}, {})
        assert reply.headers["x-reef-episode"] == SESSION
        first = next(reply.events)
        reply.events.close()
    assert b"message_start" in first
    [rec] = srv.gateway.list_records("relay")["records"]
    assert rec["status"] == "cancelled" and rec["episode"] == SESSION
    assert rec["error"] == "the client closed the stream before its end" and rec["response"] is not None
    assert sum(r.getMessage().startswith("cancelled anthropic.messages stream in scenario relay") for r in
               caplog.records) == 1
    # the whole answer, through the real server: an ok record in the same episode (Claude Code's session)
    an = anthropic.Anthropic(base_url=srv.url, api_key="k", default_headers={"x-reef-scenario": "relay"},
                             max_retries=0)
    an.messages.create(model="claude-x", max_tokens=50, metadata={"user_id": CLAUDE_USER_ID},
                       messages=[{"role": "user", "content": "hi"}])
    ep = requests.get(f"{srv.url}/reef/episodes/{SESSION}", headers={"x-reef-scenario": "relay"}).json()
    assert [(r["turn"], r["status"]) for r in ep["records"]] == [(1, "cancelled"), (2, "ok")]


def test_a_provider_4xx_is_a_refused_record(serve, provider, caplog):
    srv = serve(UpstreamEngine(provider.url, timeout=10))
    an = anthropic.Anthropic(base_url=srv.url, api_key="k", max_retries=0,
                             default_headers={"x-reef-scenario": "relay", "x-claude-code-session-id": SESSION})
    with caplog.at_level(logging.INFO, logger="reef_lab.gateway.unanswered"):
        with pytest.raises(anthropic.BadRequestError):
            an.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user",
                                                                          "content": "REEF-FAIL status=400"}])
    [rec] = srv.gateway.list_records("relay")["records"]
    assert rec["status"] == "refused" and rec["error"] == "upstream answered HTTP 400" and rec["episode"] == SESSION
    assert any("refused anthropic.messages call in scenario relay: the provider answered HTTP 400" in r.getMessage()
               for r in caplog.records)
