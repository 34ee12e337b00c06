"""An engine on the trainer's CPUs stands aside for each training step (issue 28, results/train-beside-vllm.md): the
learner holds `YieldsToTraining.training_step()` around every round's training and never around generation; the
vLLM engine pauses its server (`/pause?mode=keep&clear_cache=false`) for as long as any step holds it (up to
max_pause_s), and a weight switch in the meantime (another scenario's release) pauses with `abort` as before
without resuming a step's pause. The server is a loopback double that logs the calls (the real one:
tests/test_vllm_engine.py)."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
from contextlib import contextmanager

import pytest

from reef_lab.engines.base import YieldsToTraining
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.vllm import STEP_PAUSE, VLLMEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.learner import read_metrics
from tests.test_learning import EVAL, TRAINER, drive


class StandingAside(EmbeddedEngine, YieldsToTraining):
    """The embedded engine, logging what ran while a training step held it."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.held, self.steps, self.submitted = 0, 0, []  # submitted: (release asked for, under a step?)

    @contextmanager
    def training_step(self):
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
            self.steps += 1

    def submit(self, request):
        self.submitted.append((request.release, self.held > 0))
        return super().submit(request)


def test_the_learner_holds_the_engine_aside_for_each_training_round_and_never_while_generating(tiny_model_dir,
                                                                                               tmp_path):
    engine = StandingAside.from_path(str(tiny_model_dir), max_batch=8)
    gw = Gateway(tmp_path / "data", engine)
    try:
        gw.create_scenario({"name": "s", "recipe": "sao", "config": {
            "batch_size": 4, "critic_warmup_steps": 1, "trainer": TRAINER, "critic_lr": 1e-3, **EVAL}})
        drive(gw, "s", 8)  # a warm-up round and a policy round, then the candidate's held-out evaluation
        ln = gw.learner("s")
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
        assert [m["phase"] for m in steps] == ["critic_warmup", "policy"]
        assert all(m["train_s"] > 0 for m in steps)
        assert engine.steps == 2 and engine.held == 0
        evaluation = [held for release, held in engine.submitted if release is not None]  # the candidate's
        assert len(evaluation) >= 4 and not any(evaluation)  # held-out items: after the step let go (or it waits)
        assert gw.list_releases("s")["serving"] == "s:v1"
    finally:
        gw.close()


def test_a_failed_training_round_lets_the_engine_go_and_the_next_round_trains(tiny_model_dir, tmp_path):
    """A step that raises ends its hold on the engine (a paused vLLM server would otherwise answer nothing again):
    the round is logged as an error, its samples go back to the pool, and the retry holds the engine afresh, trains
    them and releases."""
    engine = StandingAside.from_path(str(tiny_model_dir), max_batch=8)
    gw = Gateway(tmp_path / "data", engine)
    try:
        gw.create_scenario({"name": "s", "recipe": "sao", "config": {
            "batch_size": 4, "critic_warmup_steps": 0, "trainer": TRAINER, "critic_lr": 1e-3, **EVAL}})
        ln = gw.learner("s")
        train, held, errors = ln.recipe.train, [], []

        def fails_first(trainer, batch):
            held.append(engine.held)
            if len(held) == 1:
                errors.append(engine.held)
                raise RuntimeError("the step failed")
            return train(trainer, batch)
        ln.recipe.train = fails_first
        drive(gw, "s", 4)
        deadline = time.time() + 300  # (wait_idle may answer in the pause between the failure and its retry)
        while gw.list_releases("s")["serving"] != "s:v1" and time.time() < deadline:
            time.sleep(0.1)
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        assert errors == [1] and held == [1, 1] and engine.held == 0 and engine.steps == 2
        assert [m["event"] for m in read_metrics(ln.metrics_path)][:2] == ["error", "step"]
        assert gw.list_releases("s")["serving"] == "s:v1"
    finally:
        gw.close()


class FakeVLLM(http.server.ThreadingHTTPServer):
    """Answers what VLLMEngine calls outside generation, logging each POST; `fail` paths answer 500."""

    def __init__(self):
        self.calls, self.fail = [], set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - http.server's name
                self._answer(200, {"data": [{"id": "fake"}]} if self.path == "/v1/models" else {})

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.calls.append(self.path)
                self._answer(500 if self.path.split("?")[0] in outer.fail else 200, {})

            def log_message(self, *a):
                pass
        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


PAUSE = f"/pause?mode={STEP_PAUSE}"


@pytest.fixture
def fake_vllm():
    srv = FakeVLLM()
    yield srv
    srv.shutdown()


def test_vllm_pauses_once_for_overlapping_steps_and_a_switch_meanwhile_keeps_it_paused(fake_vllm, tiny_model_dir,
                                                                                      tmp_path):
    engine = VLLMEngine(tiny_model_dir, url=f"http://127.0.0.1:{fake_vllm.server_port}", pause_for_training=True)
    release = tmp_path / "release"
    shutil.copytree(tiny_model_dir, release)  # the base's own tensors: a release the weights transport takes
    engine.load_release("s:v1", release)
    calls = fake_vllm.calls
    with engine.training_step():
        with engine.training_step():  # a second scenario's learner steps at the same time
            assert calls == [PAUSE]
        assert calls == [PAUSE]  # the first step still holds it
        engine.route("s", "s:v1")  # a release goes live meanwhile: its switch freezes, drops the prefix cache
        assert calls[1] == "/pause?mode=keep&clear_cache=true" and calls[2] == "/collective_rpc"
        assert "/resume" not in calls  # the switch leaves the step's pause in place
    assert calls[-1] == "/resume" and calls.count("/resume") == 1
    assert engine.gate.held == "s:v1"


def test_a_step_that_raises_still_resumes_the_server(fake_vllm, tiny_model_dir):
    engine = VLLMEngine(tiny_model_dir, url=f"http://127.0.0.1:{fake_vllm.server_port}", pause_for_training=True)
    with pytest.raises(RuntimeError, match="the step failed"):
        with engine.training_step():
            raise RuntimeError("the step failed")
    assert fake_vllm.calls == [PAUSE, "/resume"]
    with engine.training_step():  # the count is back to none: the next step pauses again
        pass
    assert fake_vllm.calls[2:] == [PAUSE, "/resume"]


def test_a_step_longer_than_max_pause_lets_the_server_go_on_beside_it(fake_vllm, tiny_model_dir):
    """On a starved machine a step took 11 minutes, and requests waiting through it outwaited the stream's timeout
    (600 s) and failed: past max_pause_s the server resumes while the step goes on, and the step's end owes nothing."""
    import time
    engine = VLLMEngine(tiny_model_dir, url=f"http://127.0.0.1:{fake_vllm.server_port}", pause_for_training=True,
                        max_pause_s=0.5)
    with engine.training_step():
        deadline = time.monotonic() + 60
        while "/resume" not in fake_vllm.calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake_vllm.calls == [PAUSE, "/resume"]
    assert fake_vllm.calls == [PAUSE, "/resume"]  # resumed once
    engine.max_pause_s = 60
    with engine.training_step():  # a step within the bound keeps the server paused to its end
        time.sleep(1)
        assert fake_vllm.calls[2:] == [PAUSE]
    assert fake_vllm.calls[2:] == [PAUSE, "/resume"]


def test_a_step_runs_when_the_server_cannot_pause_and_no_pause_when_turned_off(fake_vllm, tiny_model_dir):
    url = f"http://127.0.0.1:{fake_vllm.server_port}"
    fake_vllm.fail.add("/pause")
    engine = VLLMEngine(tiny_model_dir, url=url, pause_for_training=True)
    ran = False
    with engine.training_step():
        ran = True
    assert ran and fake_vllm.calls == [PAUSE]  # refused: no /resume owed
    fake_vllm.fail.clear()
    with engine.training_step():
        pass
    assert fake_vllm.calls[1:] == [PAUSE, "/resume"]
    fake_vllm.calls.clear()
    attached = VLLMEngine(tiny_model_dir, url=url)  # attached by URL: another machine's server, left alone
    with attached.training_step():
        pass
    assert attached.pause_for_training is False and fake_vllm.calls == []
