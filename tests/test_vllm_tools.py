"""Tool calls on a real vLLM CPU server (`bash scripts/setup.sh --vllm`) on SmolLM2: the SDKs' tool loops in all three
dialects, and the same prompt and the same parsed calls as the embedded engine gives (one template, one parser)."""

from __future__ import annotations

import pytest

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.vllm import VLLMEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.testing import free_port
from reef_lab.testing.vllm_scoring import vllm_model
from tests.conftest import Running
from tests.test_tool_calls import Client
from tests.tool_model import COPY
from tests.test_vllm_engine import MODEL

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    if vllm_model() is None:
        pytest.skip("vLLM is not installed: bash scripts/setup.sh --vllm")
    vllm = Running(Gateway(tmp_path_factory.mktemp("vllm-tools"), VLLMEngine(MODEL, port=free_port())))
    embedded = Running(Gateway(tmp_path_factory.mktemp("emb-tools"), EmbeddedEngine.from_path(max_batch=4)))
    yield vllm, embedded
    vllm.stop()
    embedded.stop()


def records(server, scenario):
    return server.gateway.list_records(scenario, "inference")["records"]


@pytest.mark.parametrize("dialect, stream", [("chat", False), ("chat", True), ("responses", True),
                                             ("anthropic", True), ("anthropic", False)])
def test_vllm_tool_loop(servers, dialect, stream):
    vllm, _ = servers
    c = Client(vllm.url, dialect, f"v-{dialect}-{stream}", session=f"run-{dialect}-{stream}")
    history = [c.user(COPY)]
    text, calls, _ = c.ask(history, stream)
    assert [(n, a) for _, n, a in calls] == [("get_weather", {"city": "Paris"})], (text, calls)
    history += c.answered(calls, text, ["sunny, 21 C"])
    final, calls2, _ = c.ask(history, stream)
    assert final and calls2 == [], (final, calls2)
    first, second = records(vllm, f"v-{dialect}-{stream}")
    assert first["metadata"]["tool_calls"][0]["id"] == calls[0][0] and second["metadata"] == {"tool_calls": []}
    assert len(first["token_ids"]) == len(first["logprobs"]) > 0
    # the loop is one episode: its two calls in turn order, the tool call in turn 1, its result in turn 2's request
    ep = vllm.gateway.get_episode(f"v-{dialect}-{stream}", f"run-{dialect}-{stream}")
    assert [(r["id"], r["turn"]) for r in ep["records"]] == [(first["id"], 1), (second["id"], 2)], ep
    assert ep["records"][0]["metadata"]["tool_calls"][0]["name"] == "get_weather"
    assert "sunny, 21 C" in str(ep["records"][1]["request"])


def test_vllm_and_embedded_record_the_same_prompt_and_calls(servers):
    vllm, embedded = servers
    got = {}
    for name, server in (("vllm", vllm), ("embedded", embedded)):
        c = Client(server.url, "chat", "same")
        c.ask([c.user(COPY)], False)
        [rec] = records(server, "same")
        got[name] = rec
    assert got["vllm"]["prompt_token_ids"] == got["embedded"]["prompt_token_ids"]
    strip = lambda r: [{k: v for k, v in t.items() if k != "id"} for t in r["metadata"]["tool_calls"]]  # noqa: E731
    assert strip(got["vllm"]) == strip(got["embedded"]) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
