"""Training recipes end to end on a tiny random-init Llama: traffic and reports in, a trained release out and served.

Each smoke test drives the real gateway in-process: inferences through the embedded engine, reports with scores,
the learner training in its thread, a candidate evaluated on a held-out arithmetic set, release v1 published and
routed. They check what every recipe must do (docs/extending.md): a finite loss, every trainable parameter changed, and the
release serving the scenario's next request.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import requests
import torch
from safetensors.torch import load_file

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.learner import read_metrics
from reef_lab.tasks.base import make_task
from tests.conftest import Running

EVAL = {"eval_task": {"name": "arithmetic"}, "eval_size": 4, "eval_max_tokens": 4}
TRAINER = {"lr": 1e-3, "micro_batch_size": 4}


@pytest.fixture
def gateway(tiny_model_dir, tmp_path):
    engine = EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=8)
    gw = Gateway(tmp_path / "data", engine)
    yield gw
    gw.close()


def ask(gw, scenario, item, *, temperature=1.0, seed=0, group=None):
    body = {"model": "tiny", "messages": item["messages"], "max_tokens": 6, "temperature": temperature,
            "seed": seed}
    reply = gw.infer("openai.chat", body, scenario, tags={"group": group} if group else {})
    text = json.loads(reply.body)["choices"][0]["message"]["content"]
    return reply.headers["x-reef-agent-record-id"], reply.headers["x-reef-release-id"], text


def drive(gw, scenario, n, *, group_size=1, score=lambda i, text: float(i % 2)):
    items = make_task().items(n // group_size, seed=5)
    k = 0
    for j, item in enumerate(items):
        for g in range(group_size):
            receipt, _, text = ask(gw, scenario, item, seed=k, group=f"p{j}" if group_size > 1 else None)
            gw.report(scenario, {"score": score(k, text), "references": [receipt]})
            k += 1


def check_trained(gw, scenario, base_dir: Path):
    ln = gw.learner(scenario)
    assert ln.wait_idle(300), ln.status()
    assert ln.last_error is None, ln.last_error
    rels = gw.list_releases(scenario)
    assert rels["serving"] == f"{scenario}:v1", rels
    rel = rels["releases"][0]
    assert rel["parent"] == "base" and rel["records"] and rel["eval"]["n"] == 4
    steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step" and m.get("policy_step")]
    assert steps and all(math.isfinite(m["loss"]) for m in steps)
    base = load_file(str(base_dir / "model.safetensors"))
    new = load_file(str(Path(rel["folder"]) / "model.safetensors"))
    assert set(base) == set(new)
    unchanged = [k for k in base if torch.equal(base[k], new[k])]
    assert unchanged == [], f"parameters that did not change: {unchanged}"
    meta = json.loads((Path(rel["folder"]) / "reef_checkpoint.json").read_text())
    assert meta["scenario"] == scenario and meta["trainer_step"] >= 1
    # the next request of the scenario is served by the release, and its record says so
    receipt, release, _ = ask(gw, scenario, make_task().items(1, seed=99)[0])
    assert release == f"{scenario}:v1"
    assert gw.get_record(scenario, receipt)["release_id"] == f"{scenario}:v1"
    # another scenario still gets the base weights
    assert ask(gw, "other", make_task().items(1, seed=99)[0])[1] == "base"
    return rels


def test_sft_smoke(gateway, tiny_model_dir):
    gateway.create_scenario({"name": "s", "recipe": "sft", "config": {
        "batch_size": 4, "score_threshold": 1.0, "trainer": TRAINER, **EVAL}})
    drive(gateway, "s", 8)  # half score 1: one batch of 4
    check_trained(gateway, "s", tiny_model_dir)


def test_sao_smoke(gateway, tiny_model_dir):
    gateway.create_scenario({"name": "s", "recipe": "sao", "config": {
        "batch_size": 4, "critic_warmup_steps": 1, "trainer": TRAINER, "critic_lr": 1e-3, **EVAL}})
    drive(gateway, "s", 8)  # one warm-up batch, one policy batch
    rels = check_trained(gateway, "s", tiny_model_dir)
    steps = [m for m in read_metrics(gateway.learner("s").metrics_path) if m["event"] == "step"]
    assert [m["phase"] for m in steps] == ["critic_warmup", "policy"]
    policy = steps[1]
    assert 0 <= policy["masked_fraction"] <= 1 and math.isfinite(policy["value_abs_error"])
    assert rels["releases"][0]["trainer_step"] == 1


def test_grpo_smoke(gateway, tiny_model_dir):
    gateway.create_scenario({"name": "s", "recipe": "grpo", "config": {
        "batch_size": 8, "group_size": 4, "trainer": TRAINER, **EVAL}})
    drive(gateway, "s", 8, group_size=4)
    check_trained(gateway, "s", tiny_model_dir)


def test_dpo_smoke(gateway, tiny_model_dir):
    """DPO, a recipe whose loss is its own (a SequenceLoss): two rollouts per prompt scored 0 and 1 make four pairs,
    one step against the frozen base (a full fine-tune: a frozen copy of it)."""
    gateway.create_scenario({"name": "s", "recipe": "dpo", "config": {
        "batch_pairs": 4, "group_size": 2, "beta": 0.5, "trainer": TRAINER, **EVAL}})
    drive(gateway, "s", 8, group_size=2)  # k = 2j scores 0, k = 2j + 1 scores 1: one pair per prompt
    check_trained(gateway, "s", tiny_model_dir)
    (step,) = [m for m in read_metrics(gateway.learner("s").metrics_path) if m["event"] == "step"]
    assert step["pairs"] == 4 and step["units"] == 4 and step["score_gap_mean"] == 1.0
    # the first step starts from the reference itself: every margin 0, the loss log 2
    assert step["margin_mean"] == pytest.approx(0.0, abs=1e-5) and step["loss"] == pytest.approx(math.log(2), abs=1e-5)


def test_lora_exports_merged_weights(gateway, tiny_model_dir):
    gateway.create_scenario({"name": "s", "recipe": "sft", "config": {
        "batch_size": 4, "trainer": {**TRAINER, "lora_rank": 4, "lora_targets": ["q_proj", "v_proj"]}}})
    drive(gateway, "s", 8)
    ln = gateway.learner("s")
    assert ln.wait_idle(300) and ln.last_error is None, ln.status()
    rel = gateway.list_releases("s")["releases"][0]
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    new = load_file(str(Path(rel["folder"]) / "model.safetensors"))
    assert set(base) == set(new)  # a plain model folder, adapters merged
    changed = {k for k in base if not torch.equal(base[k], new[k])}
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed)


def test_restart_serves_the_release_and_resumes_learning(tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    gw = Gateway(data, EmbeddedEngine.from_path(str(tiny_model_dir)))
    gw.create_scenario({"name": "s", "recipe": "sft", "config": {"batch_size": 4, "trainer": TRAINER}})
    drive(gw, "s", 8)  # 4 good samples: one batch, release v1
    assert gw.learner("s").wait_idle(300)
    drive(gw, "s", 4)  # 2 more good samples wait in the pool when the server stops
    gw.close()
    gw = Gateway(data, EmbeddedEngine.from_path(str(tiny_model_dir)))
    try:
        assert ask(gw, "s", make_task().items(1, seed=99)[0])[1] == "s:v1"
        ln = gw.learner("s")
        assert ln.wait_idle(60) and ln.status()["pool"] == 2  # replayed, not trained twice
        drive(gw, "s", 4)  # two more: a full batch again, trained from v1's weights
        assert ln.wait_idle(300) and ln.last_error is None
        rels = gw.list_releases("s")
        assert rels["serving"] == "s:v2" and rels["releases"][1]["parent"] == "s:v1"
        assert set(rels["releases"][1]["records"]).isdisjoint(rels["releases"][0]["records"])
    finally:
        gw.close()


def test_a_restart_trains_again_what_the_lost_steps_had_learned(tiny_model_dir, tmp_path):
    """A step's weights live in the process until a candidate is exported; a crash (or stop) before that loses them,
    so its samples are replayed after the restart and trained again, not counted as learned (seen live: a worker
    killed by the OOM killer between two steps of a candidate, whose samples then never reached a release)."""
    data = tmp_path / "data"
    gw = Gateway(data, EmbeddedEngine.from_path(str(tiny_model_dir)))
    gw.create_scenario({"name": "s", "recipe": "sft", "config": {"batch_size": 4, "steps_per_candidate": 2,
                                                                  "trainer": TRAINER}})
    drive(gw, "s", 8)  # 4 good samples: one step of the two a candidate needs
    ln = gw.learner("s")
    assert ln.wait_idle(300) and ln.status()["trainer_step"] == 1 and ln.status()["consumed"] == 0
    gw.close()
    gw = Gateway(data, EmbeddedEngine.from_path(str(tiny_model_dir)))
    try:
        ln = gw.learner("s")
        # the step's 4 samples are back in the pool (a full batch again: trained from the base once more)
        assert ln.wait_idle(300) and ln.status()["trainer_step"] == 1, ln.status()
        drive(gw, "s", 8)  # 4 more: the second step, and the candidate names all 8 samples
        assert ln.wait_idle(300) and ln.last_error is None
        rels = gw.list_releases("s")
        assert rels["serving"] == "s:v1" and len(rels["releases"][0]["records"]) == 8  # both steps' samples
        assert ln.status()["consumed"] > 0
    finally:
        gw.close()


def _demo(i: int, completion: list[int], prompt: list[int] | None = None) -> dict:
    """A train record as a client imports it: a demonstration with its token ids (POST /reef/records/batch)."""
    return {"id": f"demo-{i}", "scenario": "s", "kind": "train", "request": {"messages": [
        {"role": "user", "content": f"q{i}"}]}, "response": {"role": "assistant", "content": f"a{i}"},
        "prompt_token_ids": prompt or [1, 9, 14 + i], "token_ids": completion, "score": 1.0}


class Client:
    """The tiny model's gateway on loopback (tests/conftest.py `Running`) and its learning routes over HTTP."""

    def __init__(self, data_dir: Path, model_dir: Path):
        self.data_dir, self.model_dir = data_dir, model_dir
        self.start()

    def start(self) -> None:
        self.running = Running(Gateway(self.data_dir, EmbeddedEngine.from_path(str(self.model_dir))))
        self.url, self.gateway = self.running.url, self.running.gateway

    def restart(self) -> None:
        self.running.stop()
        self.start()

    def post(self, path: str, body: dict) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=60)

    def create(self, **config) -> None:
        r = self.post("/reef/scenarios", {"name": "s", "recipe": "sft", "config": {
            "batch_size": 4, "trainer": TRAINER, **config}})
        assert r.status_code == 201, r.text

    def train(self) -> None:
        r = self.post("/reef/train", {"scenario": "s"})
        assert r.status_code == 202, r.text
        assert self.gateway.learner("s").wait_idle(300)

    def releases(self) -> dict:
        r = requests.get(self.url + "/reef/scenarios/s/releases", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def served(tmp_path, tiny_model_dir, monkeypatch):
    from reef_lab.learning import learner

    # the wait after a failed round (live: 2 s, 4 s, ...)
    monkeypatch.setattr(learner, "RETRY_WAIT_S", 0.05, raising=False)
    client = Client(tmp_path / "data", tiny_model_dir)
    yield client
    client.running.stop()


def test_a_failed_round_gives_its_batch_back_and_the_next_round_trains_it(served, monkeypatch):
    """Issue 38 item 15: a round that raised took its batch out of the pool for good (back only after a restart).
    Now its samples return to the pool, the next round trains them, and the release names them."""
    from reef_lab.trainers.torch_trainer import TorchTrainer

    real, calls = TorchTrainer.step, []

    def flaky(self, samples, loss):
        calls.append(len(samples))
        if len(calls) == 1:
            raise RuntimeError("injected: the first step fails")
        return real(self, samples, loss)
    monkeypatch.setattr(TorchTrainer, "step", flaky)
    served.create(mode="manual")
    assert served.post("/reef/records/batch", {"records": [_demo(i, [20 + i, 31, 2]) for i in range(4)]}
                       ).status_code == 201
    served.train()
    learner = served.releases()["learner"]
    assert learner["last_error"] == "RuntimeError: injected: the first step fails" and learner["pool"] == 4, learner
    served.train()  # the same four, trained now
    rels = served.releases()
    assert rels["learner"]["last_error"] is None and rels["learner"]["failed"] == [], rels["learner"]
    assert calls == [4, 4] and rels["serving"] == "s:v1", (calls, rels)
    assert sorted(rels["releases"][0]["records"]) == [f"demo-{i}" for i in range(4)]


def test_a_batch_that_always_fails_is_failed_after_max_tries_and_the_next_batch_trains(served, monkeypatch):
    """Issue 38 item 15: a batch whose step always raises must not loop for ever (nor be skipped silently): after
    MAX_TRIES rounds its samples are failed, each listed with the error in the status and in state.json (a restart
    does not replay them, and still lists them), and the scenario trains the next batch."""
    from reef_lab.learning.learner import MAX_TRIES
    from reef_lab.trainers.torch_trainer import TorchTrainer

    real, rounds = TorchTrainer.step, []

    def poisoned(self, samples, loss):
        rounds.append([s.record_id for s in samples])
        if "demo-0" in rounds[-1]:
            raise RuntimeError("injected: demo-0's batch always fails")
        return real(self, samples, loss)
    monkeypatch.setattr(TorchTrainer, "step", poisoned)
    served.create()  # mode auto: each failed round is retried by itself
    served.post("/reef/records/batch", {"records": [_demo(i, [20 + i, 31, 2]) for i in range(4)]})
    assert served.gateway.learner("s").wait_idle(300)
    learner = served.releases()["learner"]
    # (the pool is ordered by content, not arrival: the same four each time, in a fixed order of their own)
    assert [sorted(r) for r in rounds] == [[f"demo-{i}" for i in range(4)]] * MAX_TRIES and learner["pool"] == 0, \
        (rounds, learner)
    assert rounds[0] == rounds[1] == rounds[2]
    assert learner["failed_samples"] == 4 and sorted(f["record"] for f in learner["failed"]) == [
        f"demo-{i}" for i in range(4)], learner
    assert {(f["rounds"], f["error"]) for f in learner["failed"]} == {
        (MAX_TRIES, f"in {MAX_TRIES} failed rounds, the last: RuntimeError: injected: demo-0's batch always fails")}
    served.post("/reef/records/batch", {"records": [_demo(i, [20 + i, 31, 2]) for i in range(4, 8)]})
    assert served.gateway.learner("s").wait_idle(300)
    rels = served.releases()
    assert rels["serving"] == "s:v1" and sorted(rels["releases"][0]["records"]) == [f"demo-{i}" for i in range(4, 8)]
    assert len(rounds) == MAX_TRIES + 1
    served.restart()
    assert served.gateway.learner("s").wait_idle(300)
    learner = served.releases()["learner"]
    assert learner["pool"] == 0 and learner["failed_samples"] == 4, learner  # not replayed, still listed
    assert len(rounds) == MAX_TRIES + 1


def test_a_failed_export_leaves_its_samples_to_the_next_candidate(served, monkeypatch):
    """Issue 38 item 15: the samples of a candidate whose export failed counted as consumed: no release named them
    and a restart would not train them again. They stay with the trainer's next candidate now."""
    from reef_lab.trainers.torch_trainer import TorchTrainer

    real, exports = TorchTrainer.export, []

    def flaky(self, folder, metadata):
        exports.append(folder)
        if len(exports) == 1:
            raise OSError("injected: no space left on device")
        return real(self, folder, metadata)
    monkeypatch.setattr(TorchTrainer, "export", flaky)
    served.create(mode="manual")
    served.post("/reef/records/batch", {"records": [_demo(i, [20 + i, 31, 2]) for i in range(4)]})
    served.train()
    learner = served.releases()["learner"]
    assert "no space left" in learner["last_error"] and learner["consumed"] == 0, learner
    served.post("/reef/records/batch", {"records": [_demo(i, [20 + i, 31, 2]) for i in range(4, 8)]})
    served.train()
    rels = served.releases()
    assert rels["serving"] == "s:v1" and sorted(rels["releases"][0]["records"]) == [f"demo-{i}" for i in range(8)]


def test_a_report_that_cannot_become_a_sample_is_listed_as_failed(served):
    """Issue 38 item 15: a record the learner could not turn into a sample was only logged; now the status lists it
    with its error (a restart tries it again)."""
    served.create(mode="manual")
    bad = {"id": "tools-demo", "scenario": "s", "kind": "train", "score": 1.0, "response": "x", "request": {
        "messages": [{"role": "user", "content": "q"}], "tools": [{"type": "function", "function": {"name": "f"}}]}}
    assert served.post("/reef/records/batch", {"records": [bad]}).status_code == 201
    assert served.gateway.learner("s").wait_idle(60)
    (failed,) = served.releases()["learner"]["failed"]
    assert failed["record"] == "tools-demo" and "needs its prompt_token_ids and token_ids" in failed["error"], failed


def test_token_ids_outside_the_vocabulary_are_refused_at_import(served):
    """Issue 38 item 5: ids up to 2^31-1 were stored and reached the trainer (a lost batch on CPU, a device-side
    assert that breaks every later CUDA call on a GPU). The import answers 400 naming the record's index in the
    batch, the field, the position and the range, and stores none of the batch."""
    served.create(mode="manual")
    vocab = served.gateway.engine.vocab_size()
    cases = [(_demo(1, [20, 2**31 - 1, 2]), f"'token_ids'[1] = {2**31 - 1}"),
             (_demo(1, [20, 31, 2], prompt=[1, 9, 3, vocab]), f"'prompt_token_ids'[3] = {vocab}")]
    for record, says in cases:
        r = served.post("/reef/records/batch", {"records": [_demo(0, [20, 31, 2]), record]})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == (
            f"records[1]: {says} is not a token id of the served model: ids must lie in 0..{vocab - 1} (its "
            "tokenizer's vocabulary): tokenize with the served model's tokenizer"), r.text
    assert requests.get(served.url + "/reef/scenarios/s/records?kind=train", timeout=30).json()["records"] == []
    ok = served.post("/reef/records/batch", {"records": [_demo(0, [20, vocab - 1, 2], prompt=[0, 9, 3])]})
    assert ok.status_code == 201, ok.text


def test_a_sample_past_the_embedding_table_fails_alone_and_the_others_train(served, monkeypatch):
    """Issue 38 item 5, in depth: an id the import let through (here: a tokenizer larger than the model's embedding
    table, as when tokens were added and the embeddings not resized) is refused by the trainer before it reaches the
    embedding: that sample fails, its error listed, without costing the round's other samples a try; they train."""
    engine = served.gateway.engine
    vocab = engine.vocab_size()
    monkeypatch.setattr(engine, "vocab_size", lambda: vocab + 16)
    served.create(mode="manual")
    served.post("/reef/records/batch", {"records": [_demo(0, [20, 31, 2]), _demo(1, [20, vocab + 5, 2]),
                                                    _demo(2, [22, 31, 2]), _demo(3, [23, 31, 2])]})
    served.train()
    learner = served.releases()["learner"]
    assert learner["pool"] == 3 and learner["last_error"] is None, learner
    (failed,) = learner["failed"]
    assert failed["record"] == "demo-1" and failed["rounds"] == 0 and failed["error"] == (
        f"completion_ids[1] = {vocab + 5} is outside the model's vocabulary 0..{vocab - 1} (token ids from another "
        "tokenizer?)"), failed
    assert [r["record"] for r in read_metrics(served.gateway.data_dir / "learn" / "s" / "metrics.jsonl")
            if r["event"] == "failed"] == ["demo-1"]
    served.post("/reef/records/batch", {"records": [_demo(4, [24, 31, 2])]})
    served.train()
    rels = served.releases()
    assert rels["learner"]["last_error"] is None and rels["learner"]["failed_samples"] == 1, rels["learner"]
    assert sorted(rels["releases"][0]["records"]) == ["demo-0", "demo-2", "demo-3", "demo-4"], rels


def test_the_critic_refuses_ids_past_its_embedding_too(tiny_model_dir):
    """SAO asks its critic for values before the policy's step: the critic checks the ids as the policy does."""
    from reef_lab.trainers.samples import Sample
    from reef_lab.trainers.base import CriticConfig, InvalidSamples
    from reef_lab.trainers.torch_trainer import TorchTrainer

    critic = TorchTrainer(tiny_model_dir).critic(CriticConfig(lr=1e-3))
    vocab = critic.trunk.get_input_embeddings().num_embeddings
    good = Sample("good", [1, 2], [3, 4], None, 1.0, "base")
    bad = Sample("bad", [1, vocab], [3, 4], None, 1.0, "base")
    for call in (lambda: critic.values([good, bad]), lambda: critic.update([good, bad], [[0.0, 0.0]] * 2)):
        with pytest.raises(InvalidSamples) as e:
            call()
        assert e.value.errors == {"bad": f"prompt_ids[1] = {vocab} is outside the model's vocabulary 0..{vocab - 1} "
                                         "(token ids from another tokenizer?)"}
    assert len(critic.values([good])) == 1
