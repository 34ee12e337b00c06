"""The official openai and anthropic SDKs through reef_lab relaying to a stub provider on loopback."""

import anthropic
import openai
import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine

H = {"x-reef-scenario": "demo", "x-reef-tag-user": "alice"}


@pytest.fixture
def oai(proxy):
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", default_headers=H, max_retries=0)


@pytest.fixture
def ant(proxy):
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", default_headers=H, max_retries=0)


def stored(proxy, rid):
    return proxy.gateway.store.get(rid)


def test_chat_completion_carries_receipt_and_is_recorded(proxy, oai):
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    rid = raw.headers["x-reef-agent-record-id"]
    assert raw.parse().choices[0].message.content == "echo: hi"
    r = stored(proxy, rid)
    assert r["scenario"] == "demo" and r["kind"] == "inference" and r["dialect"] == "openai.chat"
    assert r["request"]["messages"][0]["content"] == "hi"
    assert r["response"]["choices"][0]["message"]["content"] == "echo: hi"
    assert r["tags"] == {"user": "alice"} and r["timing"]["total_ms"] > 0


def test_chat_stream_ends_with_receipt_chunk(proxy, oai):
    chunks = list(oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "a b"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == "echo: a b"
    last = chunks[-1]
    assert last.choices == []
    rid = last.reef["agent_record_id"]
    r = stored(proxy, rid)
    assert r["response"]["choices"][0]["message"]["content"].strip() == "echo: a b"
    assert r["response"]["choices"][0]["finish_reason"] == "stop"


def test_responses_plain_and_stream(proxy, oai):
    raw = oai.responses.with_raw_response.create(model="m", input="hello")
    assert raw.parse().output_text == "echo: hello"
    assert stored(proxy, raw.headers["x-reef-agent-record-id"])["dialect"] == "openai.responses"
    events = list(oai.responses.create(model="m", input="streamed", stream=True))
    assert events[-1].type == "response.completed"
    rid = events[-1].reef["agent_record_id"]
    assert stored(proxy, rid)["response"]["output"][0]["content"][0]["text"] == "echo: streamed"
    with oai.responses.stream(model="m", input="helper") as st:
        assert st.get_final_response().output_text == "echo: helper"


def test_anthropic_messages_plain_stream_and_count(proxy, ant):
    raw = ant.messages.with_raw_response.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "yo"}])
    assert raw.parse().content[0].text == "echo: yo"
    r = stored(proxy, raw.headers["x-reef-agent-record-id"])
    assert r["dialect"] == "anthropic.messages" and r["response"]["stop_reason"] == "end_turn"
    events = list(ant.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "s t"}],
                                      stream=True))
    assert events[-1].type == "message_stop"
    rid = events[-1].reef["agent_record_id"]
    assert stored(proxy, rid)["response"]["content"][0]["text"].strip() == "echo: s t"
    with ant.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}]) as st:
        assert st.get_final_message().content[0].text.strip() == "echo: x"
    assert ant.messages.count_tokens(model="m", messages=[{"role": "user", "content": "x"}]).input_tokens == 5


def test_models_lists_upstream(oai):
    assert [m.id for m in oai.models.list()] == ["stub-model"]


def test_upstream_faults_map_to_clear_errors_and_server_stays_up(proxy, oai, serve):
    with pytest.raises(openai.InternalServerError) as e:  # provider 5xx -> 502
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "!500"}])
    assert e.value.status_code == 502 and "HTTP 500" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:  # provider 4xx relayed as is
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "!400"}])
    assert "stub refuses" in str(e.value)
    with pytest.raises(openai.APIStatusError) as e:  # provider slower than upstream_timeout -> 504
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "!sleep=3"}])
    assert e.value.status_code == 504 and "did not answer" in e.value.message
    dead = serve(UpstreamEngine("http://127.0.0.1:9", timeout=1.0), data_dir=proxy.gateway.data_dir.parent / "d2")
    r = requests.post(dead.url + "/v1/chat/completions", headers=H,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 502 and "unreachable" in r.json()["error"]["message"]
    ok = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "still here"}])
    assert ok.choices[0].message.content == "echo: still here"
    errors = proxy.gateway.list_records("demo", "inference")["records"]
    statuses = [r["status"] for r in errors]  # failures are data too; the provider's 4xx is a refusal
    assert statuses.count("error") == 2 and statuses.count("refused") == 1


def test_upstream_model_override_and_key(serve, stub_url, monkeypatch):
    monkeypatch.setenv("REEF_UPSTREAM_API_KEY", "sk-up")
    eng = UpstreamEngine(stub_url, model="forced")
    assert eng._headers("/v1/chat/completions", {})["authorization"] == "Bearer sk-up"
    assert eng._headers("/v1/messages", {})["x-api-key"] == "sk-up"
    p = serve(eng)
    r = requests.post(p.url + "/v1/chat/completions", headers=H,
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.json()["model"] == "forced"
