"""The experiment runner end to end on the tiny model (rollouts through the gateway, verifier scores, training,
releases), its resume, the YAML front end, and apps/sao.py reading the run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.experiments.weights import ExperimentConfig, run_experiment
from reef_lab.learning.learner import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, **kw) -> ExperimentConfig:
    base = dict(name="exp", recipe="sao", rollouts=16, concurrency=4, max_pool=8, max_tokens=4,
                out_dir=str(tmp_path / "run"),
                recipe_config={"batch_size": 8, "critic_warmup_steps": 1, "steps_per_candidate": 1,
                               "eval_task": {"name": "arithmetic"}, "eval_size": 4, "eval_max_tokens": 4,
                               "trainer": {"lr": 1e-3, "micro_batch_size": 8}, "critic_lr": 1e-3})
    base.update(kw)
    return ExperimentConfig(**base)


@pytest.mark.heavy
def test_sao_experiment_runs_and_resumes(tiny_model_dir, tmp_path, monkeypatch):
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
    assert len(fig.axes) == 6
    assert str(run) in mod.find_runs(tmp_path)
    # the whole app, headless, pointed at the run the way `REEF_LAB_RUN=<dir> marimo run apps/sao.py` does
    monkeypatch.setenv("REEF_LAB_RUN", str(run))
    _, env = mod.app.run()
    assert env["run_ui"].value == str(run) and env["run"]["config"]["name"] == cfg.name


def test_a_run_that_lost_a_candidate_writes_no_summary(tiny_model_dir, tmp_path, monkeypatch):
    """A candidate that fails to export (here a full disk) leaves serving as it was, and the run ends with an error
    that names the candidate and the cause, without summary.json: compare_recipes would skip a run with one."""
    from reef_lab.errors import ReefError
    from reef_lab.trainers.torch_trainer import TorchTrainer

    def full_disk(self, folder, metadata):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(TorchTrainer, "export", full_disk)
    cfg = config(tmp_path, recipe="grpo", group_size=4, recipe_config={
        "group_size": 4, "batch_size": 8, "steps_per_candidate": 2, "trainer": {"lr": 1e-3}})
    with pytest.raises(ReefError, match=r"1 candidate\(s\) of exp failed \(c1: OSError: .*No space left.*remove "):
        run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert not (Path(cfg.out_dir) / "summary.json").exists()
    assert (Path(cfg.out_dir) / "rollouts.jsonl").read_text().count("\n") == 16  # the reports are kept


def test_grpo_experiment_groups_rollouts(tiny_model_dir, tmp_path):
    cfg = config(tmp_path, recipe="grpo", group_size=4, recipe_config={
        "group_size": 4, "batch_size": 8, "steps_per_candidate": 2, "trainer": {"lr": 1e-3}})
    summary = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["releases"] == 1 and summary["final_accuracy"] is None  # no eval_task: nothing to score
    steps = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    assert len(steps) == 2 and all(m["samples"] == 8 for m in steps)
    beat = json.loads((Path(cfg.out_dir) / "heartbeat.json").read_text())  # what the apps read its status from
    assert beat["state"] == "finished" and beat["pid_start"] is not None


def test_bad_experiment_configs_say_what_to_fix():
    with pytest.raises(ValueError, match="multiple of group_size"):
        ExperimentConfig(rollouts=10, group_size=4)
    with pytest.raises(ValueError, match="group_size must equal"):
        ExperimentConfig(recipe="grpo", group_size=2, recipe_config={"group_size": 4}, rollouts=8)


@pytest.mark.heavy
def test_experiment_is_an_offline_wandb_run(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = config(tmp_path, recipe="sft", recipe_config={"batch_size": 4, "score_threshold": 0.0,
                                                         "eval_task": {"name": "arithmetic"}, "eval_size": 4,
                                                         "eval_max_tokens": 4, "trainer": {"lr": 1e-3}})
    run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    runs = list((Path(cfg.out_dir) / "data" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(runs[0])], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["display_name"] == "exp-seed0" and run["run_group"] == "exp" and run["project"] == "reef_lab"
    config_text = json.dumps(run["config"])
    assert '"batch_size"' in config_text and '"rollouts"' in config_text  # recipe config and experiment config
    history = [json.dumps(r) for r in records if r["type"] == "history"]
    assert sum('"train/loss"' in h for h in history) == 4  # 16 rollouts, batch 4: a row per training step
    assert any('"eval/accuracy"' in h for h in history)
    assert any('"release/version_number"' in h for h in history)


def test_auto_picks_vllm_only_where_it_can_serve_the_run(tmp_path, monkeypatch):
    import reef_lab.engines.vllm as vllm
    from reef_lab.experiments.driver import choose_engine

    lora = {"trainer": {"lora_rank": 8}}

    def auto(cfg: ExperimentConfig) -> str:
        return choose_engine(cfg.model_path, cfg.lora)[0]
    monkeypatch.setattr(vllm, "DEFAULT_PYTHON", tmp_path / "none")
    assert auto(ExperimentConfig(recipe_config=lora)) == "embedded"
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setattr(vllm, "DEFAULT_PYTHON", python)
    assert auto(ExperimentConfig(recipe_config=lora)) == "vllm"
    assert auto(ExperimentConfig()) == "embedded"  # full fine-tune: vLLM cannot reload it
    assert auto(ExperimentConfig(recipe_config=lora, model_path="/m")) == "embedded"
