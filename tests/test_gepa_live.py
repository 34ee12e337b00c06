"""Live GEPA: traffic and reports with feedback through the server produce a harness release that serves next.

The provider is the loopback stub (reef_lab/testing/stub_provider.py), which is also the task and reflection model:
it echoes arithmetic questions (wrong) unless the system text holds REEF-SOLVE, and asked to rewrite an instruction
file it answers with one that holds REEF-SOLVE. So every number below is computed by hand.
"""

from __future__ import annotations

import time

import openai
import requests

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.testing.stub_provider import IMPROVED_INSTRUCTION

H = {"x-reef-scenario": "calc"}
QUESTIONS = [("Calculate 12 + 30.", "42"), ("Calculate 7 - 9.", "-2"), ("Calculate ( 3 + 4 ).", "7")]


def wait(url, predicate, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        body = requests.get(f"{url}/reef/scenarios/calc/releases").json()
        if predicate(body):
            return body
        time.sleep(0.1)
    raise AssertionError(f"timed out; last state {body}")


def test_reports_with_feedback_evolve_and_serve_a_new_harness(serve, stub_url, tmp_path):
    srv = serve(UpstreamEngine(stub_url, model="stub-model", timeout=5.0), recipe="gepa")
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", default_headers=H)
    # the seed harness serves from the first request
    first = client.chat.completions.with_raw_response.create(
        model="stub-model", messages=[{"role": "user", "content": QUESTIONS[0][0]}])
    assert first.headers["x-reef-release-id"] == "calc:v1"
    seed = requests.get(f"{srv.url}/reef/harness", headers=H).json()
    assert seed["release_id"] == "calc:v1" and seed["files"]["system_prompt.md"] == "You are a helpful assistant."
    receipts = [first.headers["x-reef-agent-record-id"]]
    for q, _ in QUESTIONS[1:]:
        r = client.chat.completions.with_raw_response.create(model="stub-model",
                                                             messages=[{"role": "user", "content": q}])
        receipts.append(r.headers["x-reef-agent-record-id"])
    bad = requests.post(f"{srv.url}/reef/report", headers=H, json={
        "score": 0, "references": [receipts[0]], "metadata": {"answer": [42]}})
    assert bad.status_code == 400 and "metadata.answer" in bad.json()["error"]["message"]
    for receipt, (q, answer) in zip(receipts, QUESTIONS):
        r = requests.post(f"{srv.url}/reef/report", headers=H, json={
            "score": 0.0, "feedback": f"Wrong: you repeated the question; the answer is {answer}.",
            "references": [receipt], "metadata": {"answer": answer}})
        assert r.status_code == 200, r.text
    state = wait(srv.url, lambda b: b["serving"] == "calc:v2", timeout=120)
    learner = state["learner"]
    # seed on 16 validation items, the child on the 3 traffic examples and the 16 validation items; the seed's
    # rollouts on the traffic examples were the reported ones, so they cost nothing
    assert learner["metric_calls"] == 16 + 3 + 16 and learner["candidates"] == 2
    rel = state["releases"][-1]
    assert rel["release_id"] == "calc:v2" and rel["kind"] == "harness" and rel["parent"] == "calc:v1"
    assert rel["gepa"]["changed"] == "rules.md" and rel["gepa"]["parents"] == [0]
    assert rel["gepa"]["val_mean"] == 1.0 == rel["eval"]["accuracy"] and rel["gepa"]["serving_val_mean"] == 0.0
    assert sorted(rel["records"]) == sorted(receipts)
    harness = requests.get(f"{srv.url}/reef/harness", headers=H).json()
    assert harness["release_id"] == "calc:v2" and harness["files"]["rules.md"] == IMPROVED_INSTRUCTION
    # the next request is served with it (the stub now solves), and says so
    nxt = client.chat.completions.with_raw_response.create(
        model="stub-model", messages=[{"role": "user", "content": "Calculate 20 - 5."}])
    assert nxt.headers["x-reef-release-id"] == "calc:v2" and nxt.parse().choices[0].message.content == "15"
    # the reflection read the user's feedback
    events = (tmp_path / "data" / "learn" / "calc" / "gepa" / "events.jsonl").read_text()
    assert "accepted" in events


def test_restart_resumes_the_search_and_the_serving_harness(serve, stub_url, tmp_path):
    data = tmp_path / "data"
    srv = serve(UpstreamEngine(stub_url, model="stub-model", timeout=5.0), recipe="gepa", data_dir=data)
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", default_headers=H)
    for q, answer in QUESTIONS:
        r = client.chat.completions.with_raw_response.create(model="stub-model",
                                                             messages=[{"role": "user", "content": q}])
        requests.post(f"{srv.url}/reef/report", headers=H, json={
            "score": 0, "feedback": "wrong", "references": [r.headers["x-reef-agent-record-id"]],
            "metadata": {"answer": answer}}).raise_for_status()
    wait(srv.url, lambda b: b["serving"] == "calc:v2", timeout=120)
    srv.stop()
    again = serve(UpstreamEngine(stub_url, model="stub-model", timeout=5.0), recipe="gepa", data_dir=data)
    body = requests.get(f"{again.url}/reef/scenarios/calc/releases").json()
    assert body["serving"] == "calc:v2" and body["learner"]["metric_calls"] == 35
    assert body["learner"]["examples"] == 3 and body["learner"]["candidates"] == 2
    assert requests.get(f"{again.url}/reef/harness", headers=H).json()["release_id"] == "calc:v2"


def test_manual_mode_runs_on_request(serve, stub_url, tmp_path):
    from reef_lab.gateway.gateway import Gateway

    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, model="stub-model", timeout=5.0))
    try:
        gw.create_scenario({"name": "calc", "recipe": "gepa", "config": {"mode": "manual"}})
        assert gw.get_harness("calc")["release_id"] == "calc:v1"
        body = {"model": "stub-model", "messages": [{"role": "user", "content": QUESTIONS[0][0]}]}
        reply = gw.infer("openai.chat", body, "calc")
        gw.report("calc", {"score": 0, "feedback": "wrong", "references": [reply.headers["x-reef-agent-record-id"]],
                           "metadata": {"answer": "42"}})
        ln = gw.learner("calc")
        assert ln.wait_idle(30) and ln.status()["rounds"] == 0
        assert gw.train("calc")["queued"] is True
        assert ln.wait_idle(60) and ln.status()["rounds"] == 1
        assert gw.list_releases("calc")["serving"] == "calc:v2"
    finally:
        gw.close()
