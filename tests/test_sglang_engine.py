"""The SGLang engine against a loopback double of SGLang's native API (reef_lab/testing/sglang_server.py): traffic
through the gateway with the official SDK, token ids and logprobs recorded, a trained release served as a LoRA
adapter by name (or as full weights with pause/continue), rollback, and a release that fails to load."""

from __future__ import annotations

import json

import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.remote import EngineError
from reef_lab.engines.sglang import SGLangEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.tasks.base import make_task
from reef_lab.testing.sglang_server import SGLangDouble, SGLangDoubleServer
from tests.conftest import Running

SFT = {"batch_size": 4, "score_threshold": 0.0, "trainer": {"lr": 1e-3, "micro_batch_size": 4, "lora_rank": 4}}


@pytest.fixture
def double(tiny_model_dir):
    inner = EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=8)
    server = SGLangDoubleServer(SGLangDouble(inner, tiny_model_dir))
    yield server
    server.shutdown()
    inner.close()


def serve(tmp_path, double, tiny_model_dir, transport):
    engine = SGLangEngine(double.url, tiny_model_dir, transport=transport)
    return Running(Gateway(tmp_path / "data", engine, default_recipe="sft", default_config=SFT))


def chat(u, scenario, messages, **kw):
    from openai import OpenAI

    client = OpenAI(base_url=u + "/v1", api_key="unused", default_headers={"x-reef-scenario": scenario})
    return client.chat.completions.with_raw_response.create(model="tiny", messages=messages, max_tokens=6, **kw)


def train_one_release(u, scenario):
    for i, item in enumerate(make_task().items(4, seed=3)):
        raw = chat(u, scenario, item["messages"], temperature=1.0, seed=i)
        r = requests.post(u + "/reef/report", headers={"x-reef-scenario": scenario},
                          json={"score": 1.0, "references": [raw.headers["x-reef-agent-record-id"]]})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("transport", ["lora", "weights"])
def test_sglang_engine_serves_records_trains_and_rolls_back(tmp_path, double, tiny_model_dir, transport):
    server = serve(tmp_path, double, tiny_model_dir, transport)
    try:
        u, gw = server.url, server.gateway
        raw = chat(u, "s", [{"role": "user", "content": "hi"}])
        text = raw.parse().choices[0].message.content
        rec = requests.get(f"{u}/reef/scenarios/s/records/{raw.headers['x-reef-agent-record-id']}").json()
        assert rec["release_id"] == "base" and len(rec["token_ids"]) == len(rec["logprobs"]) > 0
        assert rec["prompt_token_ids"] == gw.engine.prompt_ids([{"role": "user", "content": "hi"}])
        assert all(lp <= 0 for lp in rec["logprobs"]) and rec["response"]["choices"][0]["message"]["content"] == text
        streamed = chat(u, "s", [{"role": "user", "content": "hi"}], stream=True, temperature=0.0)
        assert "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)

        train_one_release(u, "s")
        ln = gw.learner("s")
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        assert gw.list_releases("s")["serving"] == "s:v1"
        after = chat(u, "s", [{"role": "user", "content": "hi"}])
        assert after.headers["x-reef-release-id"] == "s:v1"
        rec = requests.get(f"{u}/reef/scenarios/s/records/{after.headers['x-reef-agent-record-id']}").json()
        assert rec["release_id"] == "s:v1"
        if transport == "lora":
            assert "s:v1" in double.app.adapters  # served by name, beside the base
            assert chat(u, "other", [{"role": "user", "content": "hi"}]).headers["x-reef-release-id"] == "base"
        else:
            calls = double.app.calls
            i = calls.index("/update_weights_from_disk")
            assert calls[i - 1] == "/pause_generation" and calls[i + 1] == "/continue_generation"
            assert double.app.weight_version == "s:v1"

        r = requests.post(u + "/reef/scenarios/s/rollback", json={"release_id": "base"})
        assert r.status_code == 200 and r.json()["serving"] == "base"
        assert chat(u, "s", [{"role": "user", "content": "hi"}]).headers["x-reef-release-id"] == "base"
        if transport == "weights":
            assert double.app.weight_version == "default"
    finally:
        server.stop()


def test_a_release_that_fails_to_load_leaves_serving_alone(tmp_path, double, tiny_model_dir):
    engine = SGLangEngine(double.url, tiny_model_dir, transport="lora")
    broken = tmp_path / "broken"
    (broken / "adapter").mkdir(parents=True)
    (broken / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (broken / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(EngineError, match="load_lora_adapter failed with HTTP 400"):
        engine.load_release("s:v1", broken)
    assert engine.loaded_releases() == ["base"] and "s:v1" not in double.app.adapters
    with pytest.raises(ValueError, match="holds no LoRA adapter"):
        engine.load_release("s:v2", tmp_path)  # a full fine-tune's folder has no adapter to serve by name
    with pytest.raises(ValueError, match="not loaded"):
        engine.route("s", "s:v1")


def test_the_engine_speaks_sglangs_wire_format(double, tiny_model_dir):
    """What the double refuses as sglang does: a `seed` key (sglang's is `sampling_seed`), an unknown adapter."""
    r = requests.post(double.url + "/generate", json={"input_ids": [1, 2], "sampling_params": {"seed": 1}})
    assert r.status_code == 400 and "unknown field `seed`" in r.json()["error"]
    r = requests.post(double.url + "/generate", json={"input_ids": [1, 2], "lora_path": "nope"})
    assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
    r = requests.post(double.url + "/generate", json={"input_ids": [1, 2], "return_logprob": True,
                                                      "sampling_params": {"max_new_tokens": 3, "temperature": 0}})
    meta = r.json()["meta_info"]
    assert all(len(e) == 3 and e[2] is None for e in meta["output_token_logprobs"])
    assert meta["finish_reason"]["type"] in ("stop", "length") and meta["weight_version"] == "default"
    engine = SGLangEngine(double.url, tiny_model_dir)
    from reef_lab.engines.base import ChatRequest, SamplingParams

    gen = engine.submit(ChatRequest([{"role": "user", "content": "x"}], SamplingParams(max_tokens=4, seed=7))).result()
    assert len(gen.token_ids) == len(gen.logprobs) > 0 and gen.release_id == "base"
    assert engine.healthy()
    double.app.healthy = False
    assert not engine.healthy()
