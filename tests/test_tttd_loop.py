"""TTT-Discover's loop on a real gateway with the tiny model: rollouts recorded and their rewards reported, the archive
grows by PUCT expansions, groups get entropic advantages, one IS step per grid serves the new policy (records after
a step name it), a stopped run resumes at its next step, the final policy becomes a release with the best solution
beside it; live, a server scenario with recipe tttd runs on POST /reef/train."""

from __future__ import annotations

import orjson
import pytest
import requests

from recipes.tttd import discover
from recipes.tttd.config import TTTDConfig
from recipes.tttd.discover import Discovery
from recipes.tttd.experiment import TTTDExperimentConfig, run_tttd_experiment
from recipes.tttd.problems import Problem, Verdict
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from tests.conftest import Running


class Lengthy(Problem):
    """A stand-in problem whose reward varies with the reply, so groups are never all equal (the tiny model cannot
    write a circle program): reward = distinct characters / 10, invalid when the reply is empty."""

    name, invalid_reward = "lengthy", 0.0

    @classmethod
    def from_config(cls, cfg):
        return cls()

    def initial_solution(self) -> str:
        return "start"

    def prompt(self, solution: str, reward: float) -> list[dict]:
        return [{"role": "user", "content": f"improve {solution} ({reward:.2f})"}]

    def verify(self, text: str) -> Verdict:
        body = text.replace("```python", "").replace("```", "").strip()
        if not body:
            return Verdict(0.0, False, "format", "empty", None)
        return Verdict(len(set(body)) / 10, True, "ok", "", body)


CONFIG = dict(groups=2, rollouts_per_group=3, steps=2, archive_size=20, max_tokens=8, concurrency=6, kl_coef=0.1,
              trainer={"lora_rank": 4, "lr": 1e-3, "micro_batch_size": 6}, mode="manual")


@pytest.fixture
def lengthy(monkeypatch):
    monkeypatch.setattr(discover, "make_problem", lambda cfg: Lengthy())


def test_steps_train_serve_resume_and_release(tmp_path, tiny_model_dir, lengthy):
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir)), allowed_recipes=["tttd"])
    try:
        gw.create_scenario({"name": "t", "recipe": "tttd", "config": CONFIG}, operator=True)
        d = gw.learner("t").discovery
        assert len(d.archive) == 2 and d.state["step"] == 0  # one initial state per group
        row = d.step()
        assert row["step"] == 1 and row["samples"] + 3 * row["groups_dropped"] == 6
        assert row["samples"] > 0 and all(b is None or b > 0 for b in row["betas"])
        # the parent "start" scores 0.4; random 8-token replies have more distinct characters: new and better
        assert 1 <= row["copies"] + row["better"] <= round(row["valid_fraction"] * 6)
        assert gw.engine.release_for("t") == "t:step1" and row["release"] == "t:step1"
        recs = gw.list_records("t", kind="inference", limit=50)["records"]
        reports = gw.list_records("t", kind="report", limit=50)["records"]
        assert len(recs) == 6 and len(reports) == 6 and all(r["release_id"] == "base" for r in recs)
        assert {r["tags"]["group"] for r in recs} == {"s0g0", "s0g1"}
        assert len(d.archive) > 2 and d.archive.expansions == 2
        assert "loss" in row and row["kl_sum"] is not None
    finally:
        gw.close()

    # a new process resumes at step 2 on the last policy, then publishes the final release
    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir)), allowed_recipes=["tttd"])
    try:
        d = gw.learner("t").discovery
        assert d.state["step"] == 1 and gw.engine.release_for("t") == "t:step1"
        summary = d.run()
        assert summary["steps"] == 2 and summary["release"] == "t:v1"
        recs = gw.list_records("t", kind="inference", limit=50)["records"]
        assert sum(r["release_id"] == "t:step1" for r in recs) == 6  # step 2 sampled the trained policy
        rels = gw.list_releases("t")
        assert rels["serving"] == "t:v1"
        folder = rels["releases"][0]["folder"]
        best = orjson.loads(open(f"{folder}/best.json", "rb").read())
        assert best["reward"] == d.archive.best().reward == summary["best_reward"]
        assert open(f"{folder}/best_solution.py").read() == d.archive.best().solution
        rows = d.rows()
        assert [r["step"] for r in rows] == [1, 2] and rows[-1]["best_reward"] >= rows[0]["best_reward"]
    finally:
        gw.close()


def test_best_of_n_samples_the_base_from_the_start_only(tmp_path, tiny_model_dir, lengthy):
    cfg = TTTDExperimentConfig(name="bon", out_dir=str(tmp_path / "run"), config={
        **{k: v for k, v in CONFIG.items() if k != "mode"}, "policy_updates": False, "reuse": False},
        wandb={"mode": "disabled"})
    summary = run_tttd_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["steps"] == 2 and summary["rollouts"] == 12 and summary["release"] == "none"
    rows = [orjson.loads(x) for x in open(tmp_path / "run/data/learn/bon/metrics.jsonl", "rb")]
    assert all(r["parent_rewards"] == [0.4, 0.4] for r in rows)  # always the start ("start": 4 distinct / 10)
    assert (tmp_path / "run/data/learn/bon/best_solution.py").read_text()
    assert orjson.loads((tmp_path / "run/summary.json").read_bytes())["best_reward"] == summary["best_reward"]
    assert orjson.loads((tmp_path / "run/heartbeat.json").read_bytes())["state"] == "finished"  # what apps/ttt.py reads


def test_live_scenario_runs_on_train_and_reports_status(tmp_path, tiny_model_dir, lengthy):
    server = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir)),
                             allowed_recipes=["tttd"]))
    try:
        r = requests.post(server.url + "/reef/scenarios", json={"name": "live", "recipe": "tttd",
                                                               "config": {**CONFIG, "steps": 1}})
        assert r.status_code in (200, 201), r.text
        r = requests.post(server.url + "/reef/train", headers={"x-reef-scenario": "live"})
        assert r.status_code in (200, 202), r.text
        ln = server.gateway.learner("live")
        assert ln.wait_idle(300) and ln.last_error is None
        status = requests.get(server.url + "/reef/status").json()["learners"]["live"]
        assert status["step"] == 1 and status["release"] == "live:v1" and status["best_reward"] >= 0.4
        r = requests.post(server.url + "/reef/train", headers={"x-reef-scenario": "live"})
        assert r.status_code == 409 and "finished" in r.json()["error"]["message"]
    finally:
        server.stop()


def test_bad_configs_are_refused_with_the_field(tmp_path, tiny_model_dir):
    server = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir))))
    try:
        r = requests.post(server.url + "/reef/scenarios", json={"name": "x", "recipe": "tttd",
                                                               "config": {"rollouts_per_group": 2}})
        assert r.status_code == 400 and "rollouts_per_group" in r.json()["error"]["message"]
    finally:
        server.stop()
    with pytest.raises(ValueError, match="concurrency"):
        TTTDConfig(concurrency=0)


def test_a_step_neither_reads_back_its_records_nor_wakes_its_own_learner(tmp_path, tiny_model_dir, lengthy,
                                                                         monkeypatch):
    """The context's infer returns the stored record (token ids, logprobs), so a rollout is never read back from the
    store; the reports the loop makes on its own rollouts are stored, not handed back to the learner, which ignores
    reports anyway."""
    from recipes.tttd.learner import TTTDLearner
    from reef_lab.records.store import RecordStore

    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir)), allowed_recipes=["tttd"])
    try:
        gw.create_scenario({"name": "t", "recipe": "tttd", "config": {**CONFIG, "steps": 1}}, operator=True)
        d = gw.learner("t").discovery
        reads, woken = [], []
        for name in ("get", "get_many"):
            original = getattr(RecordStore, name)
            monkeypatch.setattr(RecordStore, name, lambda self, *a, _o=original, **kw: reads.append(a) or _o(self, *a, **kw))
        monkeypatch.setattr(TTTDLearner, "on_record", lambda self, record: woken.append(record["id"]))
        row = d.step()
        assert row["samples"] > 0 and reads == [] and woken == []
        assert len(gw.list_records("t", kind="report", limit=50)["records"]) == 6  # the rewards are still reported
    finally:
        gw.close()
