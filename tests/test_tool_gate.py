"""The release gate judges tool episodes (issue 39 item 3): a scenario whose `eval_task` is a tool task scores each
candidate by running held-out episodes through the gateway's own inference path (tool calls executed by the task,
their results read back), so `selection: no_regression` refuses a release that loses them.

The serving weights are the tiny Llama taught the weather-tool script (tests/tool_model.py): it calls get_weather for
Paris, reads the result and says it is sunny. A candidate trained to answer "I do not know." instead is refused.
"""

from __future__ import annotations

import json

import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.remote import ChatTokenizer
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.tool_tasks import EpisodeScore, ToolTask, tool_calls_of
from tests.conftest import Running
from tests.tool_model import TOOLS


class ParisWeather(ToolTask):
    """Ask the weather in Paris; 1 when the episode called get_weather validly and the final reply says sunny."""

    max_turns = 3

    def items(self, n, seed):
        return [{"id": f"paris-{seed}-{i}", "tools": TOOLS,
                 "messages": [{"role": "user", "content": "Weather in Paris?"}]} for i in range(n)]

    def execute(self, name, arguments):
        return "sunny, 21 C"

    def score_episode(self, item, transcript):
        valid, invalid = tool_calls_of(transcript, item["tools"])
        final = transcript[-1].get("content") or "" if transcript else ""
        ok = valid >= 1 and not invalid and "sunny" in final.lower()
        return EpisodeScore(float(ok), ok, valid, len(invalid), "right" if ok else f"final reply {final!r}")


@pytest.fixture
def tool_model_dir(tool_model, tokenizer, tmp_path):
    folder = tmp_path / "tool-model"
    tool_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_no_regression_refuses_a_release_that_loses_held_out_tool_episodes(tool_model_dir, tokenizer, tmp_path):
    s = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tool_model_dir))))
    try:
        s.gateway.create_scenario({"name": "w", "recipe": "sft", "config": {  # the operator's: it names a task class
            "mode": "manual", "batch_size": 4, "steps_per_candidate": 3, "score_threshold": 0.0,
            "selection": "no_regression", "eval_size": 2, "eval_max_tokens": 48,
            "eval_task": {"name": "tests.test_tool_gate:ParisWeather"},
            "trainer": {"lr": 3e-3, "micro_batch_size": 4}}}, operator=True)
        chat = ChatTokenizer(tokenizer, tokenizer.eos_token_id)  # the engine's template, tools offered
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        demos = [{"scenario": "w", "kind": "train", "score": 1.0, "request": {"messages": messages, "tools": TOOLS},
                  "response": {"role": "assistant", "content": "I do not know."},
                  "prompt_token_ids": chat.prompt_ids(messages, TOOLS),
                  "token_ids": chat.completion_ids("I do not know.")} for _ in range(12)]
        assert requests.post(s.url + "/reef/records/batch", json={"records": demos}, timeout=60).status_code == 201
        ln = s.gateway.learner("w")
        for _ in range(3):
            assert requests.post(s.url + "/reef/train", json={"scenario": "w"}, timeout=60).status_code == 202
            assert ln.wait_idle(600), ln.status()
        assert ln.last_error is None, ln.last_error
        rels = requests.get(s.url + "/reef/scenarios/w/releases", timeout=60).json()
        assert rels["base_eval"]["accuracy"] == 1.0, rels["base_eval"]  # the serving weights solve both episodes
        example = rels["base_eval"]["examples"][0]["text"]
        assert example.startswith('get_weather({"city": "Paris"}) -> sunny, 21 C | ') and "sunny" in example, example
        (cand,) = rels["candidates"]
        assert cand["status"] == "rejected" and rels["serving"] == "base", rels
        assert cand["eval"]["accuracy"] < 1.0 and "held-out 0.0000 < serving 1.0000" in cand["reason"], cand
        # the episodes ran through the gateway: each held-out turn is an eval record, tools offered and called
        evals = [r for r in s.gateway.store.get_many(s.gateway.store.ids("w", "eval"))]
        episodes = [r for r in evals if "tools" in r["request"]]  # the rest: the retention task's (colors)
        called = [r for r in episodes if (r["response"]["choices"][0]["message"].get("tool_calls"))]
        assert len(called) == 2 and all(r["request"]["tools"] == TOOLS for r in episodes), json.dumps(evals[:1])[:800]
        assert len(evals) - len(episodes) == 2 * 32  # the retention task, base and candidate
        assert cand["retention"]["n"] == 32 and rels["base_retention"]["n"] == 32, cand
    finally:
        s.stop()


def test_an_experiment_runs_a_tool_task_as_episodes(tool_model_dir, tmp_path):
    """The experiment driver on a tool task: each rollout is the task's whole episode through the gateway (one
    session, the tool's result read back), reported on all its calls; the learner trains on the episodes as one
    sample each, and the release is judged on held-out episodes too."""
    from reef_lab.experiments.weights import ExperimentConfig, run_experiment
    from reef_lab.learning.learner import read_metrics

    task = {"name": "tests.test_tool_gate:ParisWeather"}
    out = tmp_path / "run"
    cfg = ExperimentConfig(name="tools", recipe="sft", model_path=str(tool_model_dir), engine="embedded", rollouts=8,
                           concurrency=4, max_pool=4, max_tokens=48, temperature=0.0, task=task, out_dir=str(out),
                           wandb={"mode": "disabled"}, recipe_config={
                               "batch_size": 4, "steps_per_candidate": 2, "selection": "always", "eval_task": task,
                               "eval_size": 2, "eval_max_tokens": 48, "trainer": {"lr": 1e-4, "micro_batch_size": 4}})
    summary = run_experiment(cfg, progress=False)
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and all(r["calls"] == 2 and r["score"] == 1.0 for r in rollouts), rollouts
    steps = [r for r in read_metrics(out / "data" / "learn" / "tools" / "metrics.jsonl") if r["event"] == "step"]
    assert len(steps) == 2 and all(r["episode_samples"] == 4 for r in steps), steps
    assert summary["serving"] == "tools:v1" and summary["base_accuracy"] == 1.0, summary
