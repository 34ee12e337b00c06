"""The vLLM engine's `lora` transport with a real vLLM CPU server on SmolLM2: a release trained on the gateway's
traffic is loaded as an adapter by name and serves its scenario while another scenario stays on the base, side by
side under concurrent traffic, each answer with the logprobs of its own weights; a candidate is evaluated without
touching what serves; a broken adapter is refused and changes nothing; rollback and unload."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
from reef_lab.engines.vllm import VLLMEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.tasks.base import make_task
from reef_lab.testing.vllm_scoring import reference_logprobs, vllm_model
from tests.conftest import Running

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]

MODEL = default_cache_dir() / DEFAULT_MODEL_NAME
SFT = {"batch_size": 4, "score_threshold": 0.0, "selection": "always",
       "trainer": {"lr": 1e-3, "micro_batch_size": 4, "lora_rank": 8}}


@pytest.fixture(scope="module")
def lora_engine():
    if vllm_model() is None:
        pytest.skip("vLLM is not installed: bash scripts/setup.sh --vllm")
    engine = VLLMEngine(MODEL, port=8952, transport="lora", max_loras=2, max_lora_rank=8)
    yield engine
    engine.close()


def close_enough(gen, folder: Path, temperature: float) -> float:
    ref = reference_logprobs(folder, gen.prompt_token_ids, gen.token_ids, temperature)
    return max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True))


def test_releases_serve_side_by_side_as_adapters(lora_engine, tmp_path):
    from openai import OpenAI

    server = Running(Gateway(tmp_path / "data", lora_engine, default_recipe="sft", default_config=SFT))
    u, gw = server.url, server.gateway
    try:
        client = OpenAI(base_url=u + "/v1", api_key="unused", default_headers={"x-reef-scenario": "a"})
        for i, item in enumerate(make_task().items(4, seed=5)):
            r = client.chat.completions.with_raw_response.create(model="m", messages=item["messages"], max_tokens=6,
                                                                 temperature=1.0, seed=i)
            requests.post(u + "/reef/report", headers={"x-reef-scenario": "a"},
                          json={"score": 1.0, "references": [r.headers["x-reef-agent-record-id"]]})
        ln = gw.learner("a")
        assert ln.wait_idle(900) and ln.last_error is None, ln.status()
        rels = gw.list_releases("a")
        assert rels["serving"] == "a:v1" and lora_engine.release_for("a") == "a:v1"
        folder = Path(rels["releases"][0]["folder"])
        assert "a:v1" in [m["id"] for m in lora_engine.client.call("GET", "/v1/models")["data"]]

        # both scenarios at once: each answer from its own weights
        msgs = [{"role": "user", "content": "What is 7+5?"}]
        out, errors = {}, []

        def ask(scenario, k):
            try:
                out[(scenario, k)] = lora_engine.submit(ChatRequest(
                    msgs, SamplingParams(max_tokens=6, temperature=0.7, seed=k), scenario=scenario)).result()
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        threads = [threading.Thread(target=ask, args=(s, k)) for s in ("a", "b") for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        for (scenario, _), gen in out.items():
            assert gen.release_id == ("a:v1" if scenario == "a" else "base")
            assert close_enough(gen, folder if scenario == "a" else MODEL, 0.7) < 2e-3

        # a candidate beside the serving release, evaluated without touching it
        lora_engine.load_release("a:cand", folder)
        gen = lora_engine.submit(ChatRequest(msgs, SamplingParams(max_tokens=4), release="a:cand")).result()
        assert gen.release_id == "a:cand" and lora_engine.release_for("a") == "a:v1"
        lora_engine.unload("a:cand")

        # a broken adapter is refused and changes nothing
        broken = tmp_path / "broken"
        (broken / "adapter").mkdir(parents=True)
        (broken / "adapter" / "adapter_config.json").write_text((folder / "adapter" / "adapter_config.json").read_text())
        (broken / "adapter" / "adapter_model.safetensors").write_bytes(b"not weights")
        with pytest.raises(Exception, match="load_lora_adapter"):
            lora_engine.load_release("a:broken", broken)
        assert "a:broken" not in lora_engine.loaded_releases() and lora_engine.release_for("a") == "a:v1"

        r = requests.post(u + "/reef/scenarios/a/rollback", json={"release_id": "base"})
        assert r.status_code == 200 and r.json()["serving"] == "base"
        raw = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=6,
                                                               temperature=0.7, seed=9)
        rec = gw.get_record("a", raw.headers["x-reef-agent-record-id"])
        assert rec["release_id"] == "base" and raw.headers["x-reef-release-id"] == "base"
    finally:
        server.server.shutdown()
        server.gateway.close(close_engine=False)
