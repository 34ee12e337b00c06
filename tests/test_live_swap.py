"""Releases over HTTP: manual training, review and promote, rollback, a corrupt candidate, and the swap under load
(16 concurrent clients while three releases go live: no failed request, no response mixing two releases)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import requests

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.tasks.base import make_task

SFT = {"batch_size": 2, "mode": "manual", "trainer": {"lr": 3e-3, "micro_batch_size": 2}}
PROMPTS = [it["messages"] for it in make_task().items(4, seed=11)]


@pytest.fixture
def server(serve, tiny_model_dir):
    return serve(EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=16))


def chat(url, scenario, messages, **kw):
    return requests.post(url + "/v1/chat/completions", headers={"x-reef-scenario": scenario}, timeout=60,
                         json={"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0, **kw})


def feed(url, scenario, n):
    for i in range(n):
        r = chat(url, scenario, PROMPTS[i % 4], temperature=1.0, seed=i)
        assert r.status_code == 200
        rep = requests.post(url + "/reef/report", headers={"x-reef-scenario": scenario},
                            json={"score": 1.0, "references": [r.headers["x-reef-agent-record-id"]]})
        assert rep.status_code == 200, rep.text


def train_and_wait(url, scenario, version):
    r = requests.post(url + "/reef/train", headers={"x-reef-scenario": scenario})
    assert r.status_code == 202, r.text
    deadline = time.time() + 120
    while time.time() < deadline:
        rel = requests.get(f"{url}/reef/scenarios/{scenario}/releases").json()
        if rel["serving"] == f"{scenario}:{version}":
            return rel
        time.sleep(0.1)
    raise AssertionError(f"{version} never served: {rel}")


def first_candidate(u, scenario, status):
    """The scenario's releases once its first candidate reaches `status` (fails after two minutes)."""
    deadline = time.time() + 120
    while time.time() < deadline:
        rel = requests.get(f"{u}/reef/scenarios/{scenario}/releases").json()
        if rel["candidates"] and rel["candidates"][0]["status"] == status:
            return rel
        time.sleep(0.1)
    raise AssertionError(f"candidate c1 of {scenario} never became {status}: {rel['candidates']}")


def test_manual_training_releases_and_rollback(server):
    u = server.url
    assert requests.post(u + "/reef/scenarios", json={"name": "m", "recipe": "sft", "config": SFT}).status_code == 201
    r = requests.post(u + "/reef/train", headers={"x-reef-scenario": "m"})
    assert r.status_code == 409 and "pool holds 0" in r.json()["error"]["message"]
    assert requests.post(u + "/reef/train").status_code == 400  # no scenario named
    feed(u, "m", 2)
    rel = train_and_wait(u, "m", "v1")
    assert [x["version"] for x in rel["releases"]] == ["v1"] and rel["releases"][0]["parent"] == "base"
    assert chat(u, "m", PROMPTS[0]).headers["x-reef-release-id"] == "m:v1"
    # rollback to the base weights and back to v1; the index keeps every version
    r = requests.post(u + "/reef/scenarios/m/rollback", json={"release_id": "base"})
    assert r.status_code == 200 and r.json()["serving"] == "base"
    assert chat(u, "m", PROMPTS[0]).headers["x-reef-release-id"] == "base"
    r = requests.post(u + "/reef/scenarios/m/rollback", json={"release_id": "v1"})
    assert r.json()["serving"] == "m:v1"
    assert chat(u, "m", PROMPTS[0]).headers["x-reef-release-id"] == "m:v1"
    assert requests.post(u + "/reef/scenarios/m/rollback", json={"release_id": "v9"}).status_code == 404
    assert requests.post(u + "/reef/scenarios/m/rollback", json={}).status_code == 400
    # a basic scenario does not train
    chat(u, "plain", PROMPTS[0])
    r = requests.post(u + "/reef/train", headers={"x-reef-scenario": "plain"})
    assert r.status_code == 400 and "does not train" in r.json()["error"]["message"]


def test_review_waits_for_promote(server):
    u = server.url
    cfg = {**SFT, "selection": "review"}
    assert requests.post(u + "/reef/scenarios", json={"name": "r", "recipe": "sft", "config": cfg}).status_code == 201
    feed(u, "r", 2)
    assert requests.post(u + "/reef/train", headers={"x-reef-scenario": "r"}).status_code == 202
    rel = first_candidate(u, "r", "pending_review")
    assert rel["serving"] == "base" and rel["releases"] == []
    assert requests.post(u + "/reef/scenarios/r/promote", json={"candidate": "c9"}).status_code == 404
    r = requests.post(u + "/reef/scenarios/r/promote", json={"candidate": "c1"})
    assert r.status_code == 201 and r.json()["release"]["release_id"] == "r:v1"
    assert chat(u, "r", PROMPTS[0]).headers["x-reef-release-id"] == "r:v1"
    assert requests.post(u + "/reef/scenarios/r/promote", json={"candidate": "c1"}).status_code == 409


def test_corrupt_candidate_leaves_serving_alone(server, monkeypatch):
    from reef_lab.trainers.torch_trainer import TorchTrainer

    real_export = TorchTrainer.export

    def broken_export(self, folder, metadata):
        out = real_export(self, folder, metadata)
        f = Path(out) / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # torn write
        return out

    monkeypatch.setattr(TorchTrainer, "export", broken_export)
    u = server.url
    requests.post(u + "/reef/scenarios", json={"name": "c", "recipe": "sft", "config": SFT})
    feed(u, "c", 2)
    assert requests.post(u + "/reef/train", headers={"x-reef-scenario": "c"}).status_code == 202
    rel = first_candidate(u, "c", "failed")
    cand = rel["candidates"][0]
    assert cand["status"] == "failed" and "cannot be read" in cand["error"]
    assert rel["serving"] == "base" and rel["releases"] == []
    r = chat(u, "c", PROMPTS[0])
    assert r.status_code == 200 and r.headers["x-reef-release-id"] == "base"
    assert "cannot be read" in requests.get(u + "/reef/status").json()["learners"]["c"]["last_error"]


@pytest.mark.heavy
def test_swap_under_load(server):
    u, engine = server.url, server.gateway.engine
    requests.post(u + "/reef/scenarios", json={"name": "w", "recipe": "sft", "config": SFT})
    feed(u, "w", 6)
    results, failures, stop = [], [], threading.Event()

    def client(i: int) -> None:
        k = 0
        while not stop.is_set():
            try:
                r = chat(u, "w", PROMPTS[(i + k) % 4])
                k += 1
                if r.status_code != 200:
                    failures.append((r.status_code, r.text))
                    continue
                results.append(((i + k - 1) % 4, r.headers["x-reef-release-id"],
                                r.headers["x-reef-agent-record-id"]))
            except Exception as e:  # noqa: BLE001 - any exception is a failed request
                failures.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        for v in ("v1", "v2", "v3"):
            train_and_wait(u, "w", v)
            time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert failures == []
    seen = {rel for _, rel, _ in results}
    assert {"base", "w:v1", "w:v2", "w:v3"} <= seen, seen
    # every record names the release its response header named; every greedy answer is what that release
    # alone produces for the prompt, token for token (no answer mixes two releases' weights)
    releases = {r["release_id"]: r for r in requests.get(u + "/reef/scenarios/w/releases").json()["releases"]}
    for rid, rel in releases.items():
        if rid not in engine.loaded_releases():
            engine.load_release(rid, rel["folder"])
    alone = {}
    for rid in seen:
        for p in range(4):
            g = engine.submit(ChatRequest(PROMPTS[p], SamplingParams(max_tokens=8, temperature=0),
                                          release=rid)).result(60)
            alone[(rid, p)] = g.token_ids
    assert len({tuple(v) for v in alone.values()}) > 4  # the releases answer differently
    for p, rid, receipt in results:
        rec = server.gateway.get_record("w", receipt)
        assert rec["release_id"] == rid
        assert rec["token_ids"] == alone[(rid, p)], (rid, p)


def test_modes_and_demonstrations(server):
    u = server.url
    # auto: POST /reef/train is refused with the reason; hybrid: trains on request too
    requests.post(u + "/reef/scenarios", json={"name": "a", "recipe": "sft", "config": {**SFT, "mode": "auto",
                                                                                          "batch_size": 50}})
    r = requests.post(u + "/reef/train", json={"scenario": "a"})
    assert r.status_code == 409 and "mode 'auto'" in r.json()["error"]["message"]
    r = requests.post(u + "/reef/scenarios", json={"name": "bad", "recipe": "sft", "config": {"mode": "sometimes"}})
    assert r.status_code == 400 and "mode must be one of" in r.json()["error"]["message"]
    # SFT on imported demonstrations (kind "train"), in hybrid mode
    requests.post(u + "/reef/scenarios", json={"name": "d", "recipe": "sft", "config": {**SFT, "mode": "hybrid",
                                                                                          "batch_size": 3}})
    demos = [{"kind": "train", "request": {"messages": m}, "response": {"content": "42"}} for m in PROMPTS[:2]]
    r = requests.post(u + "/reef/records/batch", headers={"x-reef-scenario": "d"}, json={"records": demos})
    assert r.status_code == 201, r.text
    assert requests.post(u + "/reef/train", json={"scenario": "d"}).status_code == 409  # 2 of 3
    r = requests.post(u + "/reef/records/batch", headers={"x-reef-scenario": "d"}, json={"records": demos[:1]})
    deadline = time.time() + 120
    while time.time() < deadline and requests.get(u + "/reef/scenarios/d/releases").json()["serving"] != "d:v1":
        time.sleep(0.1)  # hybrid trains by itself once the batch is full
    rel = requests.get(u + "/reef/scenarios/d/releases").json()
    assert rel["serving"] == "d:v1" and len(rel["releases"][0]["records"]) == 3


def test_training_recipe_on_an_upstream_engine_is_refused(proxy):
    r = requests.post(proxy.url + "/reef/scenarios", json={"name": "t", "recipe": "sao"})
    assert r.status_code == 409 and "cannot serve" in r.json()["error"]["message"]
