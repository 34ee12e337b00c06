"""One judge live and offline (issue 51 item 5): a candidate's held-out score through the gateway (the releaser's,
each answer an `eval` record) and a finished run's offline re-scoring straight on the engine
(reef_lab.learning.evaluation) are the same function, and give the same result on the same release and items.
On the tiny random-init Llama, greedy."""

from __future__ import annotations

from reef_lab.learning.evaluation import evaluate
from reef_lab.publishing.judge import HeldOut
from reef_lab.tasks.base import make_task
from tests.test_learning import gateway  # noqa: F401 - the fixture


def test_the_live_and_the_offline_judge_agree(gateway):
    task = make_task()
    items = task.items(6, seed=11)
    live = gateway.releaser.evaluate("j", "base", HeldOut(task, items, 8))
    offline = evaluate(gateway.engine, "base", task, items, 8)
    strip = ("eval_s",)
    assert {k: v for k, v in live.items() if k not in strip} == {k: v for k, v in offline.items() if k not in strip}
    assert live["n"] == 6 and len(live["examples"]) == 6 and live["release"] == "base"
    # the live judge kept each answer as an eval record of the scenario; the offline one wrote nothing
    evals = gateway.list_records("j", kind="eval", limit=100)["records"]
    assert len(evals) == 6 and all(r["tags"]["reef.release"] == "base" for r in evals)
