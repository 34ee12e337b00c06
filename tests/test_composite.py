"""A composite scenario over HTTP (real server on loopback, the tiny model, the stub provider as GEPA's task and
reflection model, the Hub double): a weights component (sft) and a harness component (gepa), each with its own
learner, trained on the same reports; each release is a manifest of component versions that the headers,
`GET /reef/harness` and the Hub revision name; a rollback restores every component, and so does a restart."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest
import requests
from huggingface_hub import HfApi, constants

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.publishing.hub import HubConfig
from reef_lab.testing.hub_server import serve_in_thread
from reef_lab.testing.stub_provider import IMPROVED_INSTRUCTION
from tests.conftest import Running

TOKEN = "hub-test-token"
H = {"x-reef-scenario": "mix"}
QUESTIONS = [("Calculate 12 + 30.", "42"), ("Calculate 7 - 9.", "-2"), ("Calculate ( 3 + 4 ).", "7")]
SEED = {"system_prompt.md": "You are a helpful assistant.", "rules.md": "Be accurate."}


def composite(stub_url: str) -> dict:
    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    return {"components": {
        "weights": {"recipe": "sft", "config": {"mode": "manual", "batch_size": 3, "score_threshold": 0.0,
                                                "trainer": {"lr": 3e-3, "micro_batch_size": 3}}},
        "harness": {"recipe": "gepa", "config": {"mode": "manual", "task_lm": lm, "reflection_lm": lm,
                                                 "seed_harness": SEED}}}}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    server, url = serve_in_thread(tmp_path / "hub", token=TOKEN)
    yield url
    server.stop()


def start(tmp_path, tiny_model_dir, stub_url, hub_url, config: dict | None = None) -> Running:
    return Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=8),
                           default_recipe="composite", default_config=config or composite(stub_url),
                           hub=HubConfig(repo="me/reef-{scenario}", endpoint=hub_url, retries=2, backoff_s=0.2)))


def ask(client, question: str):
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", max_tokens=6, temperature=0, messages=[{"role": "user", "content": question}])
    return raw.headers


def wait_for(url: str, predicate, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = requests.get(f"{url}/reef/scenarios/mix/releases").json()
        if predicate(body):
            return body
        time.sleep(0.2)
    raise AssertionError(f"timed out; last state {json.dumps(body)[:2000]}")


def test_a_composite_scenario_trains_both_components_releases_and_rolls_back(tmp_path, tiny_model_dir, stub_url,
                                                                             hub):
    srv = start(tmp_path, tiny_model_dir, stub_url, hub)
    try:
        u, engine = srv.url, srv.gateway.engine
        client = openai.OpenAI(base_url=f"{u}/v1", api_key="x", default_headers=H)
        first = ask(client, QUESTIONS[0][0])  # the harness component's seed serves from the first request
        assert first["x-reef-release-id"] == "mix:v1"
        assert first["x-reef-release-components"] == "harness=mix:v1,weights=base"
        for q, answer in QUESTIONS:
            receipt = ask(client, q)["x-reef-agent-record-id"]
            requests.post(f"{u}/reef/report", headers=H, json={
                "score": 1.0, "feedback": f"Wrong: the answer is {answer}.", "references": [receipt],
                "metadata": {"answer": answer}}).raise_for_status()
        r = requests.post(f"{u}/reef/train", headers=H)
        assert r.status_code == 202 and set(r.json()["components"]) == {"weights", "harness"}, r.text
        body = wait_for(u, lambda b: len(b["releases"]) == 3 and all(
            c["phase"] == "idle" for c in b["learner"]["components"].values()))
        v1, *trained = body["releases"]
        assert body["serving"] == "mix:v3" and all(r["kind"] == "composite" for r in body["releases"])
        assert v1["components"] == {"harness": "mix:v1", "weights": None}
        by_component = {r["component"]: r["release_id"] for r in trained}  # each component released once
        assert set(by_component) == {"weights", "harness"}
        latest = body["releases"][-1]["components"]
        assert latest == {"weights": by_component["weights"], "harness": by_component["harness"]}
        weights_id, harness_id = latest["weights"], latest["harness"]
        for rel in body["releases"]:  # each release folder is the whole release: its manifest and components
            folder = Path(rel["folder"])
            manifest = json.loads((folder / "manifest.json").read_text())
            assert manifest["components"] == rel["components"] and (folder / "harness" / "rules.md").is_file()
        assert (Path(body["releases"][-1]["folder"]) / "weights" / "model.safetensors").is_file()

        # what serves now: both components, named on the answer and by GET /reef/harness
        h = requests.get(f"{u}/reef/harness", headers=H).json()
        assert h["release_id"] == "mix:v3" and h["components"] == latest
        assert h["files"]["rules.md"] == IMPROVED_INSTRUCTION
        now = ask(client, "Calculate 1 + 1.")
        assert now["x-reef-release-id"] == "mix:v3"
        assert now["x-reef-release-components"] == f"harness={harness_id},weights={weights_id}"
        assert engine.release_for("mix") == weights_id

        # the Hub revision of each release carries its manifest and every component
        assert srv.gateway.hub.wait(120)
        api = HfApi(endpoint=hub, token=TOKEN)
        files = api.list_repo_files("me/reef-mix", revision="v3")
        assert {"manifest.json", "harness/rules.md", "weights/model.safetensors"} <= set(files), files
        manifest = json.loads(Path(api.hf_hub_download("me/reef-mix", "manifest.json", revision="v3",
                                                       cache_dir=tmp_path / "hf")).read_text())
        assert manifest["components"] == latest

        # one rollback restores all components: the seed harness and the base weights
        r = requests.post(f"{u}/reef/scenarios/mix/rollback", json={"release_id": "v1"})
        assert r.status_code == 200 and r.json()["serving"] == "mix:v1"
        h = requests.get(f"{u}/reef/harness", headers=H).json()
        assert h["files"] == SEED and h["components"] == {"harness": "mix:v1", "weights": "base"}
        back = ask(client, "Calculate 2 + 2.")
        assert back["x-reef-release-id"] == "mix:v1" and back["x-reef-release-components"] == \
            "harness=mix:v1,weights=base"
        assert engine.release_for("mix") == "base"
        rec = requests.get(f"{u}/reef/scenarios/mix/records/{back['x-reef-agent-record-id']}").json()
        assert rec["release_id"] == "mix:v1"
        # and forward again
        assert requests.post(f"{u}/reef/scenarios/mix/rollback", json={"release_id": "v3"}).json()["serving"] == \
            "mix:v3"
        assert engine.release_for("mix") == weights_id
        assert requests.get(f"{u}/reef/harness", headers=H).json()["files"]["rules.md"] == IMPROVED_INSTRUCTION
    finally:
        srv.stop()

    # a restart serves every component of the serving release again
    again = start(tmp_path, tiny_model_dir, stub_url, hub)
    try:
        client = openai.OpenAI(base_url=f"{again.url}/v1", api_key="x", default_headers=H)
        headers = ask(client, "Calculate 3 + 3.")
        assert headers["x-reef-release-id"] == "mix:v3"
        assert headers["x-reef-release-components"] == f"harness={harness_id},weights={weights_id}"
        assert again.gateway.engine.release_for("mix") == weights_id
    finally:
        again.stop()


def test_gepa_then_context_distillation_drops_the_harness_as_one_manifest(tmp_path, tiny_model_dir, stub_url, hub):
    """GEPA -> ctxd -> no harness, as one composite: the harness component's seed serves (v1); ctxd learns from the
    answers served with it and its weights release, v2, names the harness as dropped: the manifest, GET
    /reef/harness and the answer's headers show weights alone, the prompt is shorter by the harness; a rollback
    to v1 serves the harness again."""
    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    config = {"components": {
        "harness": {"recipe": "gepa", "config": {"mode": "manual", "task_lm": lm, "reflection_lm": lm,
                                                 "seed_harness": SEED}},
        "weights": {"recipe": "ctxd", "config": {"batch_size": 3, "steps_per_candidate": 1, "top_k": 8,
                                                 "selection": "always", "trainer": {"lr": 3e-3,
                                                                                    "micro_batch_size": 3}}}}}
    srv = start(tmp_path, tiny_model_dir, stub_url, hub, config)
    try:
        u = srv.url
        client = openai.OpenAI(base_url=f"{u}/v1", api_key="x", default_headers=H)
        for q, _ in QUESTIONS:
            headers = ask(client, q)
            assert headers["x-reef-release-components"] == "harness=mix:v1,weights=base"
            requests.post(f"{u}/reef/report", headers=H, json={
                "feedback": "unscored", "references": [headers["x-reef-agent-record-id"]]}).raise_for_status()
        body = wait_for(u, lambda b: len(b["releases"]) == 2)
        v1, v2 = body["releases"]
        assert body["serving"] == "mix:v2" and v2["component"] == "weights" and v2["dropped"] == ["harness"]
        assert v2["components"] == {"harness": None, "weights": "mix:v2"} and v1["components"]["harness"] == "mix:v1"
        folder = Path(v2["folder"])
        assert json.loads((folder / "manifest.json").read_text())["dropped"] == ["harness"]
        assert not (folder / "harness").exists() and (folder / "weights" / "model.safetensors").is_file()
        h = requests.get(f"{u}/reef/harness", headers=H)
        assert h.status_code == 404 and "serves no harness release" in h.text
        now = ask(client, "Calculate 1 + 1.")
        assert now["x-reef-release-id"] == "mix:v2" and now["x-reef-release-components"] == "weights=mix:v2"
        served = requests.get(f"{u}/reef/scenarios/mix/records/{now['x-reef-agent-record-id']}").json()
        r = requests.post(f"{u}/reef/scenarios/mix/rollback", json={"release_id": "v1"})
        assert r.status_code == 200 and r.json()["serving"] == "mix:v1"
        back = ask(client, "Calculate 1 + 1.")
        assert back["x-reef-release-components"] == "harness=mix:v1,weights=base"
        with_it = requests.get(f"{u}/reef/scenarios/mix/records/{back['x-reef-agent-record-id']}").json()
        plain = srv.gateway.engine.prompt_ids([{"role": "user", "content": "Calculate 1 + 1."}])
        assert served["prompt_token_ids"] == plain != with_it["prompt_token_ids"]  # v2 serves without the harness
        r = requests.post(f"{u}/reef/scenarios/mix/rollback", json={"release_id": "v2"})
        assert r.status_code == 200 and r.json()["serving"] == "mix:v2"
    finally:
        srv.stop()
    # a restart keeps the harness dropped (the harness component does not serve its seed again)
    again = start(tmp_path, tiny_model_dir, stub_url, hub, config)
    try:
        client = openai.OpenAI(base_url=f"{again.url}/v1", api_key="x", default_headers=H)
        headers = ask(client, "Calculate 2 + 2.")
        assert headers["x-reef-release-id"] == "mix:v2" and headers["x-reef-release-components"] == "weights=mix:v2"
        assert len(requests.get(f"{again.url}/reef/scenarios/mix/releases").json()["releases"]) == 2
    finally:
        again.stop()


def test_a_composite_config_names_what_each_component_must_evolve(tmp_path, stub_url):
    from reef_lab.errors import BadRequest
    from reef_lab.learning.recipe import load_recipe

    for components, words in [({"weights": "gepa"}, "evolves harness, not weights"),
                              ({"harness": "sft"}, "evolves weights, not harness"),
                              ({"prompts": "gepa"}, "components must name some of"),
                              ({"weights": "recipes.sft:Recipe"}, "recipe folder"),
                              ({"weights": {"recipe": "sft", "config": {"batch_sise": 2}}}, "batch_sise")]:
        with pytest.raises(BadRequest) as e:
            load_recipe("composite", {"components": components})
        assert words in e.value.message, e.value.message


def test_a_harness_components_default_model_is_the_scenarios_serving_weights(tiny_model, tokenizer, tmp_path):
    """In a composite scenario the harness component's task model, left to the deployment, is EngineLM with the
    scenario: it answers with the weights routed to the scenario, not the base."""
    import copy

    import torch

    from reef_lab.engines.lm import EngineLM

    trained = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    trained.save_pretrained(tmp_path / "w")
    tokenizer.save_pretrained(tmp_path / "w")
    tiny_model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    engine = EmbeddedEngine.from_path(str(tmp_path / "base"))
    try:
        engine.load_release("mix:v2", tmp_path / "w")
        engine.route("mix", "mix:v2")
        msgs = [{"role": "user", "content": "Calculate 2 + 3."}]
        serving = EngineLM(engine, scenario="mix").complete(msgs, max_tokens=8, temperature=0)
        assert serving == EngineLM(engine, release="mix:v2").complete(msgs, max_tokens=8, temperature=0)
        assert serving != EngineLM(engine).complete(msgs, max_tokens=8, temperature=0)  # the base answers otherwise
    finally:
        engine.close()


def test_a_change_request_on_a_composite_goes_to_its_harness_component(tmp_path, tiny_model_dir, stub_url):
    """POST /reef/train {text} on a composite scenario answered 500 (AttributeError: no request_change): now the
    harness component takes it; a composite without one refuses it with 409."""
    config = composite(stub_url)
    s = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=8),
                        default_recipe="composite", default_config=config))
    try:
        assert requests.post(f"{s.url}/reef/scenarios", json={"name": "mix"}).status_code == 201
        r = requests.post(f"{s.url}/reef/train", json={"scenario": "mix", "text": "Always show your working."})
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["component"] == "harness" and body["scenario"] == "mix", body
        assert requests.get(s.url + body["url"]).json()["text"] == "Always show your working."
        r = requests.post(f"{s.url}/reef/scenarios", json={"name": "w", "recipe": "composite", "config": {
            "components": {"weights": {"recipe": "sft", "config": {"mode": "manual"}}}}})
        assert r.status_code == 201, r.text
        r = requests.post(f"{s.url}/reef/train", json={"scenario": "w", "text": "Be brief."})
        assert r.status_code == 409 and "no harness component" in r.json()["error"]["message"], r.text
    finally:
        s.stop()


def test_every_shipped_learner_has_every_method_of_the_protocol():
    """What the gateway calls on a scenario's learner (ScenarioLearner) exists on each shipped learner class, so a
    route never meets an AttributeError (the composite lacked request_change)."""
    from recipes.composite.recipe import CompositeLearner
    from recipes.gepa.learner import HarnessLearner
    from recipes.tttd.learner import TTTDLearner
    from reef_lab.learning.learner import Learner
    from reef_lab.learning.recipe import ScenarioLearner

    members = [n for n in vars(ScenarioLearner) if not n.startswith("_")]
    assert "request_change" in members and "promote" in members, members
    for klass in (CompositeLearner, HarnessLearner, TTTDLearner, Learner):
        missing = [n for n in members if not callable(getattr(klass, n, None))]
        assert missing == [], (klass.__name__, missing)
