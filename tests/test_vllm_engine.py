"""The vLLM engine with a real vLLM CPU server (`bash scripts/setup.sh --vllm`) on SmolLM2, weights transport: SDK
traffic through the gateway with token ids and logprobs that match transformers', an SAO release (LoRA, merged)
trained on it and made live while 16 clients keep asking, with no failed request and every answer after the swap
from the new release, served logprobs equal to the release's own, rollback; a reload the server refuses; a killed
and a hung server restarted."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import requests

from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
from reef_lab.engines.vllm import VLLMEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.tasks.base import make_task
from reef_lab.testing import free_port
from reef_lab.testing.vllm_scoring import reference_logprobs, vllm_model
from tests.conftest import Running

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]

MODEL = default_cache_dir() / DEFAULT_MODEL_NAME
SAO = {"batch_size": 4, "critic_warmup_steps": 0, "critic_updates": 1, "selection": "always",
       "trainer": {"lr": 1e-3, "micro_batch_size": 4, "lora_rank": 8}}


@pytest.fixture(scope="module")
def vllm_engine():
    if vllm_model() is None:
        pytest.skip("vLLM is not installed: bash scripts/setup.sh --vllm")
    # a free port: a fixed one met another worktree's vLLM test server, which answered this engine's calls
    engine = VLLMEngine(MODEL, port=free_port())
    yield engine
    engine.close()


def test_vllm_serves_trains_swaps_under_load_and_rolls_back(vllm_engine, tmp_path):
    from openai import OpenAI

    server = Running(Gateway(tmp_path / "data", vllm_engine, default_recipe="sao", default_config=SAO))
    u, gw = server.url, server.gateway
    client = OpenAI(base_url=u + "/v1", api_key="unused", default_headers={"x-reef-scenario": "s"})
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    try:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=8,
                                                               temperature=0.7, seed=1)
        rec = gw.get_record("s", raw.headers["x-reef-agent-record-id"])
        assert rec["prompt_token_ids"] == vllm_engine.prompt_ids(msgs) and rec["release_id"] == "base"
        ref = reference_logprobs(MODEL, rec["prompt_token_ids"], rec["token_ids"], 0.7)
        assert max(abs(a - b) for a, b in zip(ref, rec["logprobs"], strict=True)) < 2e-3

        failures, answers, stop = [], [], threading.Event()

        def keep_asking(k):
            c = OpenAI(base_url=u + "/v1", api_key="unused", default_headers={"x-reef-scenario": "s"})
            while not stop.is_set():
                try:
                    started = time.monotonic()
                    r = c.chat.completions.with_raw_response.create(
                        model="m", messages=[{"role": "user", "content": f"Say {k}"}], max_tokens=4)
                    answers.append((started, r.headers["x-reef-release-id"], r.headers["x-reef-agent-record-id"]))
                except Exception as e:  # noqa: BLE001 - every failure is counted
                    failures.append(repr(e))
        clients = [threading.Thread(target=keep_asking, args=(k,)) for k in range(16)]
        for t in clients:
            t.start()
        for i, item in enumerate(make_task().items(4, seed=3)):
            r = client.chat.completions.with_raw_response.create(model="m", messages=item["messages"], max_tokens=6,
                                                                 temperature=1.0, seed=i)
            requests.post(u + "/reef/report", headers={"x-reef-scenario": "s"},
                          json={"score": float(i % 2), "references": [r.headers["x-reef-agent-record-id"]]})
        swapped_at, deadline = None, time.monotonic() + 600
        while swapped_at is None and time.monotonic() < deadline:
            if gw.list_releases("s")["serving"] == "s:v1":
                swapped_at = time.monotonic()
            time.sleep(0.05)
        while sum(started > (swapped_at or deadline) for started, _, _ in list(answers)) < 32 \
                and time.monotonic() < deadline:  # the clients keep asking on the new release
            time.sleep(0.2)
        stop.set()
        for t in clients:
            t.join()
        ln = gw.learner("s")
        assert ln.wait_idle(60) and ln.last_error is None, ln.status()
        assert swapped_at is not None and failures == []
        after = [(rel, rid) for started, rel, rid in answers if started > swapped_at]
        assert len(after) >= 32 and len(answers) > len(after)
        assert {rel for rel, _ in after} == {"s:v1"}
        assert {gw.get_record("s", rid)["release_id"] for _, rid in after} == {"s:v1"}
        rels = gw.list_releases("s")
        assert rels["serving"] == "s:v1"
        raw = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=8,
                                                               temperature=0.7, seed=2)
        rec = gw.get_record("s", raw.headers["x-reef-agent-record-id"])
        assert rec["release_id"] == "s:v1" and raw.headers["x-reef-release-id"] == "s:v1"
        ref = reference_logprobs(Path(rels["releases"][0]["folder"]), rec["prompt_token_ids"], rec["token_ids"], 0.7)
        assert max(abs(a - b) for a, b in zip(ref, rec["logprobs"], strict=True)) < 2e-3  # the release's weights

        r = requests.post(u + "/reef/scenarios/s/rollback", json={"release_id": "base"})
        assert r.status_code == 200 and r.json()["serving"] == "base"
        raw = client.chat.completions.with_raw_response.create(model="m", messages=msgs, max_tokens=8,
                                                               temperature=0.7, seed=3)
        rec = gw.get_record("s", raw.headers["x-reef-agent-record-id"])
        ref = reference_logprobs(MODEL, rec["prompt_token_ids"], rec["token_ids"], 0.7)
        assert rec["release_id"] == "base" and max(abs(a - b) for a, b in zip(ref, rec["logprobs"])) < 2e-3
    finally:
        server.server.shutdown()
        server.gateway.close(close_engine=False)


def test_a_reload_the_server_refuses_leaves_the_base_serving(vllm_engine, tmp_path):
    """Weights that pass the checks when loaded but are cut short on disk before they go live: the route fails with
    the server's refusal, the held weights are put back (or the server restarted), and the base keeps serving."""
    from reef_lab.engines.base import ChatRequest, SamplingParams
    from reef_lab.engines.remote import EngineError

    folder = tmp_path / "bad"
    shutil.copytree(MODEL, folder)
    vllm_engine.load_release("r:bad", folder)
    for f in folder.glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(EngineError, match="refused release r:bad"):
        vllm_engine.route("x", "r:bad")
    assert vllm_engine.release_for("x") == "base" and vllm_engine.gate.held == "base"
    vllm_engine.unload("r:bad")
    deadline = time.monotonic() + 600
    while not vllm_engine._up.is_set() and time.monotonic() < deadline:
        time.sleep(1)
    msgs = [{"role": "user", "content": "What is 2+3?"}]
    gen = vllm_engine.submit(ChatRequest(msgs, SamplingParams(max_tokens=6, temperature=0.7, seed=4),
                                         scenario="x")).result()
    assert gen.release_id == "base"
    ref = reference_logprobs(MODEL, gen.prompt_token_ids, gen.token_ids, 0.7)
    assert max(abs(a - b) for a, b in zip(ref, gen.logprobs, strict=True)) < 2e-3  # the base's weights, whole


def test_requests_during_a_training_step_wait_and_are_answered_after_it(vllm_engine):
    """training_step() pauses the server (the trainer gets the CPUs): requests that arrive meanwhile get no token
    until the step ends, then each is answered whole, with token ids and logprobs; requests running when the step
    began are answered too."""
    from reef_lab.engines.base import ChatRequest, SamplingParams

    def ask(i: int):
        return vllm_engine.submit(ChatRequest([{"role": "user", "content": f"Count from {i} to {i + 20}."}],
                                              SamplingParams(max_tokens=24, temperature=0.7)))
    running = [ask(i) for i in range(2)]
    with vllm_engine.training_step():
        assert vllm_engine.client.call("GET", "/is_paused") == {"is_paused": True}
        arrived = [ask(i) for i in range(2, 6)]
        time.sleep(3)
        for stream in arrived:
            with pytest.raises(TimeoutError):  # queued, not generated: the server schedules nothing
                stream.result(timeout=0.01)
    assert vllm_engine.client.call("GET", "/is_paused") == {"is_paused": False}
    for gen in (s.result(timeout=600) for s in running + arrived):
        assert gen.token_ids and len(gen.logprobs) == len(gen.token_ids) and gen.release_id == "base"


def server_cpu_s(engine: VLLMEngine) -> float:
    """CPU seconds the server's whole process tree (API server, EngineCore, workers) has used."""
    import os

    from reef_lab import procs
    total = 0
    for pid in [engine._process.pid, *(p for p, _ in procs.below(engine._process.pid))]:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def test_a_paused_server_leaves_the_cpus_and_a_failed_step_still_resumes_it(vllm_engine):
    """What the pause is for: with requests waiting, a paused server uses next to no CPU (generating, it used
    1.1-1.4 CPUs of 2), so the step has the machine. A step that raises still resumes the server, and what waited is
    answered."""
    from reef_lab.engines.base import ChatRequest, SamplingParams

    def ask(i: int):
        return vllm_engine.submit(ChatRequest([{"role": "user", "content": f"Count from {i} to {i + 40}."}],
                                              SamplingParams(max_tokens=32, temperature=0.7)))
    with pytest.raises(RuntimeError, match="the step failed"):
        with vllm_engine.training_step():
            waiting = [ask(i) for i in range(8)]
            time.sleep(1)  # the requests reach the server's queue
            before, started = server_cpu_s(vllm_engine), time.monotonic()
            time.sleep(5)
            used = (server_cpu_s(vllm_engine) - before) / (time.monotonic() - started)
            assert used < 0.25, f"the paused server used {used:.2f} CPUs"
            raise RuntimeError("the step failed")
    assert vllm_engine.client.call("GET", "/is_paused") == {"is_paused": False}
    for gen in (s.result(timeout=600) for s in waiting):
        assert gen.token_ids and len(gen.logprobs) == len(gen.token_ids)


def test_requests_waiting_through_a_step_longer_than_the_timeout_are_answered(vllm_engine):
    """A step longer than the stream's timeout (11 minutes on a starved machine, against 600 s) failed every request
    that waited through it; past max_pause_s the server answers beside the step, so they are answered."""
    from reef_lab.engines.base import ChatRequest, SamplingParams

    timeout, max_pause = vllm_engine.client.timeout, vllm_engine.max_pause_s
    vllm_engine.client.timeout, vllm_engine.max_pause_s = 30, 2  # the streams' sockets time out after 30 s
    try:
        with vllm_engine.training_step():
            waiting = [vllm_engine.submit(ChatRequest([{"role": "user", "content": f"Count to {i + 5}."}],
                                                      SamplingParams(max_tokens=16, temperature=0.7)))
                       for i in range(4)]
            time.sleep(40)  # the step outlasts the timeout
    finally:
        vllm_engine.client.timeout, vllm_engine.max_pause_s = timeout, max_pause
    for gen in (s.result(timeout=600) for s in waiting):
        assert gen.token_ids and len(gen.logprobs) == len(gen.token_ids)


def test_a_killed_engine_restarts_with_503s_meanwhile_and_loses_nothing(vllm_engine, tmp_path):
    import os
    import signal
    import time

    server = Running(Gateway(tmp_path / "data", vllm_engine))
    u, gw = server.url, server.gateway
    body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    head = {"x-reef-scenario": "k"}
    try:
        assert requests.post(u + "/v1/chat/completions", json=body, headers=head).status_code == 200
        os.killpg(vllm_engine._process.pid, signal.SIGKILL)
        statuses, receipts, deadline = [], [], time.monotonic() + 600
        while time.monotonic() < deadline:
            r = requests.post(u + "/v1/chat/completions", json=body, headers=head, timeout=120)
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.headers.get("retry-after") == "5" and "retry" in r.json()["error"]["message"]
            if r.status_code == 200:
                receipts.append(r.headers["x-reef-agent-record-id"])
                if 503 in statuses:
                    break
            time.sleep(0.5)
        assert 503 in statuses and statuses[-1] == 200, statuses
        assert set(statuses) <= {200, 503} and vllm_engine.restarts == 1
        assert requests.get(u + "/healthz").status_code == 200  # the server itself never went down
        for rid in receipts:  # every acknowledged answer is a record
            assert gw.get_record("k", rid)["status"] == "ok"
    finally:
        server.server.shutdown()
        gw.store.close()


def test_a_hung_engine_is_restarted(vllm_engine, tmp_path):
    """SIGSTOP freezes the server (it accepts no answer, nothing exits): three failed health checks restart it."""
    import os
    import signal
    import time

    before = vllm_engine.restarts
    os.killpg(vllm_engine._process.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 600
    while vllm_engine.restarts == before and time.monotonic() < deadline:
        time.sleep(1)
    assert vllm_engine.restarts == before + 1 and vllm_engine.healthy()
    from reef_lab.engines.base import ChatRequest, SamplingParams
    gen = vllm_engine.submit(ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3))).result()
    assert gen.token_ids and len(gen.logprobs) == len(gen.token_ids)
