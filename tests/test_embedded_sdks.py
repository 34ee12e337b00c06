"""The official SDKs against the embedded SmolLM2-135M-Instruct (the real model, on CPU), through reef_lab.

One engine for the module (the first run converts the GGUF once, ~35 s; later runs load the cache in seconds);
generations stay short so the module runs in about a minute.
"""

import math
import threading

import anthropic
import openai
import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway

# The real SmolLM2 loaded and generating on CPU: not in the default run (.ci/run runs `pytest -m heavy`).
pytestmark = pytest.mark.heavy

H = {"x-reef-scenario": "embedded", "x-reef-tag-run": "t1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.conftest import Running
    engine = EmbeddedEngine.from_path(max_batch=8)
    r = Running(Gateway(tmp_path_factory.mktemp("emb"), engine))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", default_headers=H, max_retries=0)


def check_inference_record(server, rid, dialect):
    r = server.gateway.store.get(rid)
    assert r["kind"] == "inference" and r["dialect"] == dialect and r["status"] == "ok"
    assert r["release_id"] == "base" and r["tags"] == {"run": "t1"}
    assert r["prompt_token_ids"] and len(r["token_ids"]) == len(r["logprobs"]) > 0
    assert all(math.isfinite(x) and x <= 0 for x in r["logprobs"])
    return r


def test_chat_greedy_answer_with_tokens_and_logprobs(server, oai):
    raw = oai.chat.completions.with_raw_response.create(
        model="SmolLM2-135M-Instruct", temperature=0, max_tokens=12,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    resp = raw.parse()
    assert "Paris" in resp.choices[0].message.content
    assert raw.headers["x-reef-release-id"] == "base"
    r = check_inference_record(server, raw.headers["x-reef-agent-record-id"], "openai.chat")
    assert resp.usage.completion_tokens == len(r["token_ids"])
    assert resp.usage.prompt_tokens == len(r["prompt_token_ids"])
    again = oai.chat.completions.create(model="m", temperature=0, max_tokens=12,
                                        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert again.choices[0].message.content == resp.choices[0].message.content


def test_chat_stream_and_stop_and_seed(server, oai):
    chunks = list(oai.chat.completions.create(model="m", max_tokens=10, temperature=0.8, seed=7, stream=True,
                                              messages=[{"role": "user", "content": "Count: 1, 2, 3,"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    rid = chunks[-1].reef["agent_record_id"]
    r = check_inference_record(server, rid, "openai.chat")
    assert r["response"]["choices"][0]["message"]["content"] == text
    seeded = [oai.chat.completions.create(model="m", max_tokens=10, temperature=0.8, seed=7,
                                          messages=[{"role": "user", "content": "Count: 1, 2, 3,"}])
              .choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1] == text
    cut = oai.chat.completions.create(model="m", max_tokens=5, temperature=0,
                                      messages=[{"role": "user", "content": "Say hello"}])
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 5


def test_responses_plain_and_stream(server, oai):
    raw = oai.responses.with_raw_response.create(model="m", input="Name a color.", max_output_tokens=8,
                                                 temperature=0, instructions="Answer in one word.")
    assert raw.parse().output_text
    check_inference_record(server, raw.headers["x-reef-agent-record-id"], "openai.responses")
    # Room to finish: a response cut by max_output_tokens ends in response.incomplete, as OpenAI's does.
    with oai.responses.stream(model="m", input="Name a fruit.", instructions="Answer in one word.",
                              max_output_tokens=48, temperature=0) as st:
        deltas = [e.delta for e in st if e.type == "response.output_text.delta"]
        final = st.get_final_response()
    assert "".join(deltas) == final.output_text and final.status == "completed"
    events = list(oai.responses.create(model="m", input="Name a fruit.", max_output_tokens=4, temperature=0,
                                       stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    rid = events[-1].reef["agent_record_id"]
    check_inference_record(server, rid, "openai.responses")


def test_anthropic_messages_plain_stream_and_count(server):
    # anthropic 2.x has no temperature argument (Anthropic dropped it); extra_body sends it for a greedy check.
    ant = anthropic.Anthropic(base_url=server.url, api_key="unused", default_headers=H, max_retries=0)
    greedy = {"max_tokens": 8, "extra_body": {"temperature": 0}, "system": "Be brief."}
    raw = ant.messages.with_raw_response.create(model="m", messages=[{"role": "user", "content": "Say hi."}],
                                                **greedy)
    msg = raw.parse()
    assert msg.content[0].text and msg.stop_reason in ("end_turn", "max_tokens")
    check_inference_record(server, raw.headers["x-reef-agent-record-id"], "anthropic.messages")
    events = list(ant.messages.create(model="m", messages=[{"role": "user", "content": "Say hi."}], stream=True,
                                      **greedy))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == msg.content[0].text  # greedy: the stream says what the plain call said
    rid = events[-1].reef["agent_record_id"]
    r = check_inference_record(server, rid, "anthropic.messages")
    assert events[0].message.usage.input_tokens == len(r["prompt_token_ids"])
    with ant.messages.stream(model="m", messages=[{"role": "user", "content": "Say hi."}], **greedy) as st:
        assert st.get_final_message().content[0].text == text
    n = ant.messages.count_tokens(model="m", system="Be brief.",
                                  messages=[{"role": "user", "content": "Say hi."}]).input_tokens
    assert n == len(server.gateway.store.get(rid)["prompt_token_ids"])


def test_concurrent_requests_are_batched(server, oai):
    before = server.gateway.engine.info()["steps"]
    out, errors = [], []

    def ask(i):
        try:
            out.append(oai.chat.completions.create(model="m", max_tokens=8, temperature=0,
                                                   messages=[{"role": "user", "content": f"Say {i}"}]))
        except Exception as e:  # collected and asserted below
            errors.append(e)
    ts = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errors and len(out) == 6
    steps = server.gateway.engine.info()["steps"] - before
    assert steps < 6 * 8  # 6 requests x 8 tokens decoded alone would take 48 steps


def test_embedded_refusals_are_400(server, oai):
    with pytest.raises(openai.BadRequestError, match="'tool_choice' names function 'g'"):
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tool_choice={
            "type": "function", "function": {"name": "g"}},
                                    tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    with pytest.raises(openai.BadRequestError, match="temperature"):
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], temperature=3)
    r = requests.post(server.url + "/v1/messages", headers=H, json={"model": "m", "messages": [
        {"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    models = oai.models.list()
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct"]
