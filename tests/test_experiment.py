"""The experiment runner end to end on the tiny model (rollouts through the gateway, verifier scores, training,
releases), its resume, the YAML front end, and apps/sao.py reading the run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.experiment import ExperimentConfig, run_experiment
from reef_lab.learner import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, **kw) -> ExperimentConfig:
    base = dict(name="exp", recipe="sao", rollouts=16, concurrency=4, max_pool=8, max_tokens=4,
                out_dir=str(tmp_path / "run"),
                recipe_config={"batch_size": 8, "critic_warmup_steps": 1, "steps_per_candidate": 1,
                               "eval_task": {"name": "arithmetic"}, "eval_size": 4, "eval_max_tokens": 4,
                               "trainer": {"lr": 1e-3, "micro_batch_size": 8}, "critic_lr": 1e-3})
    base.update(kw)
    return ExperimentConfig(**base)


def test_sao_experiment_runs_and_resumes(tiny_model_dir, tmp_path):
    cfg = config(tmp_path)
    summary = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["releases"] == 1 and summary["serving"] == "exp:v1"
    assert summary["base_accuracy"] is not None and summary["final_accuracy"] is not None
    run = Path(cfg.out_dir)
    rollouts = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(r["k"] for r in rollouts) == list(range(16))
    metrics = read_metrics(summary["metrics_file"])
    assert [m["phase"] for m in metrics if m["event"] == "step"] == ["critic_warmup", "policy"]
    # resuming a finished run makes no new rollouts and keeps the releases
    again = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert len((run / "rollouts.jsonl").read_text().splitlines()) == 16
    assert again["releases"] == 1

    spec = importlib.util.spec_from_file_location("sao_app", ROOT / "apps" / "sao.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    loaded = mod.load_run(run)
    assert loaded["steps"].height == 2 and loaded["candidates"].height == 1 and loaded["releases"].height == 1
    assert loaded["steps"]["phase"].to_list() == ["critic_warmup", "policy"]
    fig = mod.plot_run(loaded)
    assert len(fig.axes) == 5
    assert str(run) in mod.find_runs(tmp_path)


def test_grpo_experiment_groups_rollouts(tiny_model_dir, tmp_path):
    cfg = config(tmp_path, recipe="grpo", group_size=4, recipe_config={
        "group_size": 4, "batch_size": 8, "steps_per_candidate": 2, "trainer": {"lr": 1e-3}})
    summary = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["releases"] == 1 and summary["final_accuracy"] is None  # no eval_task: nothing to score
    steps = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    assert len(steps) == 2 and all(m["samples"] == 8 for m in steps)


def test_bad_experiment_configs_say_what_to_fix():
    with pytest.raises(ValueError, match="multiple of group_size"):
        ExperimentConfig(rollouts=10, group_size=4)
    with pytest.raises(ValueError, match="group_size must equal"):
        ExperimentConfig(recipe="grpo", group_size=2, recipe_config={"group_size": 4}, rollouts=8)
