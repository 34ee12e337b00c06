"""The releaser is the one path from a candidate to the serving release (reef_lab.publishing.releaser): held-out
answers are records of kind `eval` tagged with what they judged; any error on the way leaves the candidate `failed`
with the error and the scenario on its release; and no other module writes the release index."""

from __future__ import annotations

import inspect
import json

import pytest

from reef_lab.learning.learner import read_metrics
from reef_lab.tasks.base import Task, make_task
from reef_lab.publishing.releases import ReleaseStore
from reef_lab.publishing.releaser import select
from tests.test_learning import gateway  # noqa: F401 - the fixture

TRAINER = {"lr": 1e-3, "micro_batch_size": 4}
WRITERS = ("new_candidate", "update_candidate", "publish_candidate", "set_serving", "update_release", "update_index")


class BrokenVerifier(Task):
    """A held-out task whose verifier raises: the candidate's evaluation fails."""

    def items(self, n, seed):
        return [{"id": f"b{i}", "messages": [{"role": "user", "content": f"Say {i}."}], "answer": str(i)}
                for i in range(n)]

    def score(self, item, text):
        raise RuntimeError("the verifier broke")


@pytest.fixture
def only_the_releaser_writes(monkeypatch):
    """Every ReleaseStore writer asserts its caller is the releaser (or the store itself)."""
    callers = []
    for name in WRITERS:
        original = getattr(ReleaseStore, name)

        def guarded(self, *a, _original=original, _name=name, **kw):
            caller = inspect.stack()[1].frame.f_globals["__name__"]
            callers.append((_name, caller))
            assert caller in ("reef_lab.publishing.releaser", "reef_lab.publishing.releases"), \
                f"{caller} wrote the release index ({_name}); only reef_lab.publishing.releaser may"
            return _original(self, *a, **kw)
        monkeypatch.setattr(ReleaseStore, name, guarded)
    return callers


def sft(gw, name, n=4, **config):
    gw.create_scenario({"name": name, "recipe": "sft", "config": {
        "batch_size": n, "score_threshold": 0.0, "trainer": TRAINER, **config}}, operator=True)
    for item in make_task().items(n, seed=3):
        rec = gw.infer_record({"model": "tiny", "messages": item["messages"], "max_tokens": 4}, name)
        gw.report(name, {"score": 1.0, "references": [rec["id"]]})
    ln = gw.learner(name)
    assert ln.wait_idle(300), ln.status()
    return ln


def test_a_candidate_whose_evaluation_raises_is_failed_with_the_error(gateway, only_the_releaser_writes):
    ln = sft(gateway, "broken", eval_task={"name": "tests.test_releaser:BrokenVerifier"}, eval_size=2,
             eval_max_tokens=2)
    cand = gateway.list_releases("broken")["candidates"][0]
    assert cand["status"] == "failed" and "the verifier broke" in cand["error"], cand
    assert gateway.list_releases("broken")["serving"] == "base" and ln.last_error and "verifier" in ln.last_error
    rows = [r for r in read_metrics(ln.metrics_path) if r["event"] == "candidate"]
    assert rows[-1]["status"] == "failed" and "the verifier broke" in rows[-1]["error"]
    assert only_the_releaser_writes  # the guard saw the writes it allowed


def test_held_out_answers_are_eval_records_of_the_release_they_judged(gateway, only_the_releaser_writes):
    sft(gateway, "judged", eval_task={"name": "arithmetic"}, eval_size=3, eval_max_tokens=2, retention_task=None)
    rels = gateway.list_releases("judged")
    assert rels["serving"] == "judged:v1", rels
    evals = gateway.list_records("judged", kind="eval", limit=100)["records"]
    by_release = {}
    for r in evals:
        assert r["tags"]["reef.eval"] == "1" and r["release_id"] == r["tags"]["reef.release"]
        by_release.setdefault(r["release_id"], []).append(r)
    # the base judged once (serving's score), the candidate once under its own key
    assert sorted(by_release) == ["base", "judged:c1"] and all(len(v) == 3 for v in by_release.values())
    assert {r["tags"].get("reef.candidate") for r in by_release["judged:c1"]} == {"c1"}
    assert rels["releases"][0]["eval"]["n"] == 3
    # they are not inferences: no report may reference them, and they are counted apart
    info = gateway.scenario_info("judged")
    assert info["records"]["eval"] == 6 and info["records"]["inference"] == 4
    with pytest.raises(Exception, match="eval record"):
        gateway.report("judged", {"score": 1, "references": [evals[0]["id"]]})


def test_rollback_and_a_harness_by_hand_go_through_the_releaser(gateway, only_the_releaser_writes):
    gateway.publish_harness("h", {"files": {"system_prompt.md": "one"}})
    gateway.publish_harness("h", {"files": {"system_prompt.md": "two"}})
    assert gateway.rollback("h", {"release_id": "v1"})["serving"] == "h:v1"
    assert gateway.get_harness("h")["files"] == {"system_prompt.md": "one"}
    assert {c for _, c in only_the_releaser_writes} <= {"reef_lab.publishing.releaser"}


def test_the_guard_catches_a_second_writer(tmp_path, only_the_releaser_writes):
    with pytest.raises(AssertionError, match="test_releaser wrote the release index"):
        ReleaseStore(tmp_path).new_candidate("s", {})


def test_one_selection_policy():
    assert select("always", None, None)[0] == "accepted"
    assert select("review", None, None)[0] == "review"
    assert select("no_regression", {"accuracy": 0.5}, {"accuracy": 0.5})[0] == "accepted"
    assert select("strict_gain", {"accuracy": 0.5}, {"accuracy": 0.5})[0] == "rejected"
    with pytest.raises(ValueError, match="selection must be one of"):
        select("sometimes", {"accuracy": 1}, {"accuracy": 0})


@pytest.mark.parametrize("tolerance, status", [(0.1, "rejected"), (0.4, "accepted"), (None, "accepted")])
def test_retention_gates_a_candidate_only_with_a_tolerance(gateway, monkeypatch, tolerance, status):
    """retention_tolerance: a candidate whose retention accuracy falls more than that below the serving release's
    is rejected (whatever the selection; here `always`), the reason naming both; without it retention never gates.
    The evaluations are fixed numbers here (held-out 0.5 vs 0.1, retention 0.5 vs 0.8): the gate is under test."""
    from reef_lab.publishing.releaser import Releaser

    monkeypatch.setattr(Releaser, "_evaluate_candidate",
                        lambda self, s, cid, cand, held_out, retention=None: ({"accuracy": 0.5, "n": 4},
                                                                              {"accuracy": 0.5, "n": 4}))
    monkeypatch.setattr(Releaser, "serving_eval", lambda self, s, held_out, log_row=None, key="eval": {
        "accuracy": 0.8 if key == "retention" else 0.1, "n": 4})
    ln = sft(gateway, "kept", eval_task={"name": "arithmetic"}, eval_size=2, eval_max_tokens=2,
             retention_tolerance=tolerance)
    [cand] = gateway.list_releases("kept")["candidates"]
    assert cand["status"] == status, cand
    if status == "rejected":
        assert cand["reason"].startswith("retention 0.5000 < serving 0.8000 - tolerance 0.1")
        assert gateway.list_releases("kept")["serving"] == "base"
    rows = [r for r in read_metrics(ln.metrics_path) if r["event"] == "candidate"]
    assert rows[-1]["retention_accuracy"] == 0.5 and rows[-1]["serving_retention_accuracy"] == 0.8


def test_a_retention_tolerance_needs_a_retention_task(gateway):
    from reef_lab.errors import BadRequest

    with pytest.raises(BadRequest, match="retention_tolerance must be in"):
        gateway.create_scenario({"name": "x", "recipe": "sft", "config": {"retention_tolerance": 0.1,
                                                                          "retention_task": None}})
