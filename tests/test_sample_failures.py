"""A sample that always fails is failed alone (issue 50 item 3): a round that raised charged every sample of its
batch a try, so an agent's acknowledged report failed after three rounds beside one imported record whose request
could not be templated again, and never trained. The step names the samples it cannot run (InvalidSamples); only
those fail, and the others train with the next batch. On the tiny random-init Llama."""

from __future__ import annotations

from reef_lab.learning.learner import read_metrics
from reef_lab.tasks.base import make_task
from tests.test_learning import TRAINER, ask, gateway  # noqa: F401 - the fixture


def test_one_sample_that_cannot_be_templated_fails_alone(gateway):
    gateway.create_scenario({"name": "c", "recipe": "sdft", "config": {
        "batch_size": 2, "trainer": TRAINER, "retention_task": None}})
    items = make_task().items(2, seed=3)
    first, _, _ = ask(gateway, "c", items[0])
    gateway.report("c", {"references": [first], "context": f"The answer is {items[0]['answer']}."})
    # an imported answer with its tokens but no request: nothing to add the teacher's context to
    status, _ = gateway.import_records({"records": [
        {"id": "imp-x", "scenario": "c", "kind": "inference", "prompt_token_ids": [5, 6, 7], "token_ids": [8, 9],
         "logprobs": [-1.0, -1.0]},
        {"id": "imp-r", "scenario": "c", "kind": "report", "references": ["imp-x"], "context": "It is 4."}]})
    assert status == 201
    ln = gateway.learner("c")
    assert ln.wait_idle(120)
    failed = {f["record"]: f for f in ln.status()["failed"]}
    assert list(failed) == ["imp-x"] and "holds no request" in failed["imp-x"]["error"], failed
    assert ln.last_error is None and ln.status()["pool"] == 1  # the agent's sample is back, charged nothing
    second, _, _ = ask(gateway, "c", items[1])
    gateway.report("c", {"references": [second], "context": f"The answer is {items[1]['answer']}."})
    assert ln.wait_idle(300) and ln.last_error is None, ln.status()
    steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
    assert len(steps) == 1 and steps[0]["samples"] == 2
    release = gateway.list_releases("c")["releases"][0]
    assert sorted(release["records"]) == sorted([first, second])  # the agent's report trained
    assert list({f["record"] for f in ln.status()["failed"]}) == ["imp-x"]
