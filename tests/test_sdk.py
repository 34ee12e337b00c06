"""The SDK (`import reef_lab`, docs/extending.md's "The SDK"): the public names, frozen here, each the object at its
home; the old import paths of 0.1 working for a release with a DeprecationWarning naming the new home, a plug-in
written against 0.1's documented imports running an experiment; `import reef_lab` staying light; and the run
readers a notebook, the apps and scripts/studies/compare_recipes.py share."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import polars as pl
import pytest

import reef_lab
from reef_lab import _moved

ROOT = Path(__file__).resolve().parents[1]

# The public surface, frozen: name -> the module that defines it (`module:attribute` where the name differs there).
# A name that disappears or moves fails test_every_public_name_is_the_object_at_its_home; changing this table is an
# entry in CHANGELOG.md (and a moved name keeps working for a release: reef_lab/_moved.py).
PUBLIC = {
    "Recipe": "reef_lab.learning.recipe", "ScenarioLearner": "reef_lab.learning.recipe",
    "LearnConfig": "reef_lab.learning.recipe", "LearnContext": "reef_lab.learning.recipe",
    "load_recipe": "reef_lab.learning.recipe", "recipe_class": "reef_lab.learning.recipe",
    "require_score": "reef_lab.learning.recipe", "WeightRecipe": "reef_lab.learning.learner",
    "Sample": "reef_lab.trainers.samples", "InvalidSamples": "reef_lab.trainers.samples",
    "Loss": "reef_lab.trainers.base", "SequenceLoss": "reef_lab.trainers.base",
    "require_sequence_losses": "reef_lab.trainers.base",
    "Task": "reef_lab.tasks.base", "VerifiedTask": "reef_lab.tasks.base", "TaskConfig": "reef_lab.tasks.base",
    "make_task": "reef_lab.tasks.base", "ToolTask": "reef_lab.tasks.tools",
    "Trainer": "reef_lab.trainers.base", "TrainerConfig": "reef_lab.trainers.base",
    "SequenceLossTrainer": "reef_lab.trainers.base", "make_trainer": "reef_lab.trainers",
    "Engine": "reef_lab.engines.base", "Generator": "reef_lab.engines.base", "Relay": "reef_lab.engines.base",
    "ReleaseHost": "reef_lab.engines.base", "YieldsToTraining": "reef_lab.engines.base",
    "ChatRequest": "reef_lab.engines.base", "SamplingParams": "reef_lab.engines.base",
    "Generation": "reef_lab.engines.base", "GenerationStream": "reef_lab.engines.base",
    "Gateway": "reef_lab.gateway.gateway", "ServeConfig": "reef_lab.config", "build_engine": "reef_lab.service",
    "build_gateway": "reef_lab.service",
    "run_experiment": "reef_lab.experiments:run", "ExperimentConfig": "reef_lab.experiments.weights",
    "ExperimentDriver": "reef_lab.experiments.driver", "RunConfig": "reef_lab.experiments.driver",
    "ExperimentContext": "reef_lab.service",
    "Run": "reef_lab.experiments.runs", "read_run": "reef_lab.experiments.runs",
    "compare_runs": "reef_lab.experiments.runs", "read_metrics": "reef_lab.learning.learner",
    "scan_records": "reef_lab.records.segments", "scenario_frames": "reef_lab.publishing.export",
    "ReefError": "reef_lab.errors", "BadRequest": "reef_lab.errors",
}


def test_every_public_name_is_the_object_at_its_home():
    assert sorted(reef_lab.__all__) == sorted(PUBLIC), "reef_lab.__all__ differs from the frozen list: a public " \
        "name was removed or added (say so in CHANGELOG.md; a moved one keeps its old path for a release)"
    for name, home in PUBLIC.items():
        module, _, attr = home.partition(":")
        obj = getattr(importlib.import_module(module), attr or name)
        assert getattr(reef_lab, name) is obj, name
        assert obj.__module__ == module, f"{name} is defined in {obj.__module__}, not at its home {module}"
        assert name in dir(reef_lab)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        reef_lab.Nope  # noqa: B018


def test_the_version_is_pyprojects():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert reef_lab.__version__ == version
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text()


def test_importing_reef_lab_imports_no_torch_transformers_or_flask():
    code = ("import sys, reef_lab; reef_lab.__all__; reef_lab.Sample, reef_lab.Task, reef_lab.Loss, reef_lab.Engine; "
            "print(sorted(m for m in ('torch', 'transformers', 'flask', 'polars') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"  # the protocols a plug-in derives from are light too


# Every old path reef_lab/_moved.py answers for: (old module, a name it had, that name's home now).
OLD_PATHS = [
    ("reef_lab.learning.samples", "Sample", "reef_lab.trainers.samples"),
    ("reef_lab.learning.tasks", "TaskConfig", "reef_lab.tasks.base"),
    ("reef_lab.learning.tool_tasks", "ToolTask", "reef_lab.tasks.tools"),
    ("reef_lab.learning.tool_demos", "turn_records", "reef_lab.tasks.demos"),
    ("reef_lab.learning.bfcl", "BfclTask", "reef_lab.tasks.bfcl"),
    ("reef_lab.learning.experiment", "ExperimentConfig", "reef_lab.experiments.weights"),
    ("reef_lab.gateway.dialects", "engine_request", "reef_lab.wire.dialects"),
    ("reef_lab.gateway.dialects", "response_text", "reef_lab.wire.text"),
    ("reef_lab.gateway.answers", "sse", "reef_lab.wire.answers"),
    ("reef_lab.gateway.accumulate", "StreamAccumulator", "reef_lab.wire.accumulate"),
    ("reef_lab.gateway.tools", "read_tools", "reef_lab.wire.tools"),
    ("reef_lab.gateway.responses_tools", "Offered", "reef_lab.wire.responses_tools"),
    ("reef_lab.gateway.translate", "Translation", "reef_lab.wire.translate"),
    ("reef_lab.gateway.translate.chat", "Reader", "reef_lab.wire.translate.chat"),
    ("reef_lab.gateway.scenarios", "ScenarioRegistry", "reef_lab.scenarios"),
    ("reef_lab.agents.script", "check_script", "reef_lab.harness.install.script"),
    ("reef_lab.agents.cli", "main", "reef_lab.harness.install.cli"),
    ("reef_lab.harness_requests", "RequestStore", "reef_lab.harness.change_requests"),
    ("reef_lab.engines.batching", "PrefillPacer", "reef_lab.engines.embedded.batching"),
    ("reef_lab.records.export", "scenario_frames", "reef_lab.publishing.export"),
    ("reef_lab.recipe", "LearnConfig", "reef_lab.learning.recipe"),
    ("reef_lab.learner", "WeightRecipe", "reef_lab.learning.learner"),
    ("reef_lab.learner_loop", "LearnerLoop", "reef_lab.learning.loop"),
    ("reef_lab.rl", "dis_loss", "reef_lab.trainers.losses"),
    ("reef_lab.evaluation", "evaluate", "reef_lab.learning.evaluation"),
    ("reef_lab.experiment", "run_experiment", "reef_lab.experiments.weights"),
    ("reef_lab.samples", "Sample", "reef_lab.trainers.samples"),
    ("reef_lab.store", "scan_records", "reef_lab.records.store"),
    ("reef_lab.record_index", "SegmentIndex", "reef_lab.records.index"),
    ("reef_lab.export", "export_parquet", "reef_lab.publishing.export"),
    ("reef_lab.releases", "ReleaseStore", "reef_lab.publishing.releases"),
    ("reef_lab.hub", "HubConfig", "reef_lab.publishing.hub"),
    ("reef_lab.tracking", "Tracker", "reef_lab.publishing.tracking"),
    ("reef_lab.lm", "OpenAICompatLM", "reef_lab.engines.lm"),
    ("reef_lab.dialects", "request_messages", "reef_lab.wire.text"),
    # modules that became packages of their name: the old module's names
    ("reef_lab.gateway", "Gateway", "reef_lab.gateway.gateway"),
    ("reef_lab.tasks", "TaskConfig", "reef_lab.tasks.base"),
    ("reef_lab.harness", "check_release", "reef_lab.harness.tree"),
    ("reef_lab.records", "Record", "reef_lab.records.record"),
]


def test_the_table_covers_every_old_path():
    tested = {old for old, _, _ in OLD_PATHS}
    assert set(_moved.MODULES) - {"reef_lab.agents"} <= tested and set(_moved.PACKAGES) <= tested
    assert "reef_lab.agents.cli" in tested  # an old package: its modules follow it


@pytest.mark.parametrize("old,name,home", OLD_PATHS, ids=[f"{o}.{n}" for o, n, _ in OLD_PATHS])
def test_an_old_path_works_with_a_warning_naming_its_new_home(old, name, home):
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved: import {name} from {home}\b") as seen:
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(home), name)
    ours = [w for w in seen if " moved: " in str(w.message)]
    assert all(Path(w.filename) == Path(__file__) for w in ours)  # it points at the line that used the old name
    assert "0.3.0" in str(ours[0].message)


def test_an_old_path_fails_as_before_where_nothing_moved():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("reef_lab.learning.nothing_here")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("reef_lab.gateway.translate.nothing_here")
    with pytest.raises(AttributeError):
        importlib.import_module("reef_lab.learning.tasks").nothing_here  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a package's own submodules import as ever, with no warning
        from reef_lab.tasks import tools
        from reef_lab.gateway import gateway
    assert tools.__name__ == "reef_lab.tasks.tools" and gateway.__name__ == "reef_lab.gateway.gateway"


def old_paths_used(root: Path) -> list[str]:
    """Imports of an old path (reef_lab/_moved.py) in the repository's own code: the shims are for code outside it.
    An import in an `except ImportError` (or ModuleNotFoundError) handler is a fallback for an older tree (a script
    that measures a previous commit), not a use."""
    found = []
    for top in ("reef_lab", "server", "recipes", "apps", "scripts"):
        for path in sorted((root / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            fallbacks = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for h in t.handlers
                         if isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                         for stmt in h.body for n in ast.walk(stmt)}
            for node in ast.walk(tree):
                if id(node) in fallbacks:
                    continue
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                             if node.module in _moved.PACKAGES]
                for name in names:
                    if _moved.homes(name) is not None or (name.rpartition(".")[0] in _moved.PACKAGES and
                                                         importlib.util.find_spec(name) is None):
                        found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
    return found


def test_the_repository_uses_no_old_path():
    assert old_paths_used(ROOT) == []


# docs/extending.md's recipe and task as 0.1 documented them (git show e7a97f5^:docs/extending.md), with the
# Sample and TaskConfig of their time: advantages in extra[...], Task from reef_lab.learning.tasks.
OLD_PLUGIN = '''
import re
from dataclasses import dataclass, field

from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import LearnConfig, require_score
from reef_lab.learning.samples import Sample
from reef_lab.learning.tasks import Task, TaskConfig
from reef_lab.trainers.base import Loss


@dataclass
class CloseConfig(LearnConfig):  # mode, selection, steps_per_candidate, eval_task, trainer, ...
    batch_size: int = field(default=4, metadata={"help": "rollouts per policy step"})


class CloseRecipe(WeightRecipe):
    name = "closeness"

    def __init__(self, **config):
        self.config = CloseConfig(**config)

    def validate_report(self, report):
        require_score(self.name, report)

    def accepts(self, sample: Sample):
        return sample.score is not None and sample.logprobs is not None

    def ready(self, pool, trainer_step, release_steps):
        return len(pool) >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        batch = pool[: self.config.batch_size]
        mean = sum(s.score for s in batch) / len(batch)
        for s in batch:
            s.extra["advantages"] = [s.score - mean] * len(s.completion_ids)
        return batch, []

    def train(self, trainer, batch):
        m = trainer.step(batch, Loss("dis"))
        return {**m, "policy_step": True, "reward_mean": sum(s.score for s in batch) / len(batch)}


class NearTarget(Task):
    def items(self, n, seed):
        target = self.config.options.get("target", 7)
        return [{"id": f"near-{seed}-{i}", "target": target,
                 "messages": [{"role": "user", "content": f"Say a number near {target}."}]} for i in range(n)]

    def score(self, item, text):
        found = re.findall(r"-?[0-9]+", text)
        return 0.0 if not found else 1.0 / (1.0 + abs(int(found[-1][:6]) - item["target"]))


DEFAULT_TASK = TaskConfig(name="old_plugin:NearTarget", options={"target": 7})
'''


def test_a_plugin_written_against_0_1_runs_an_experiment_with_warnings(tiny_model_dir, tmp_path, monkeypatch):
    """The done-when of issue 51 item 1: the recipe and task exactly as 0.1's docs wrote them run an experiment
    through `reef_lab.run_experiment` (rollouts, reports, a policy step on extra["advantages"], a release), each old
    use warning with its new home; then the run reads back through `reef_lab.read_run` and `compare_runs`."""
    (tmp_path / "old_plugin.py").write_text(OLD_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    task = {"name": "old_plugin:NearTarget", "options": {"target": 7}}
    data = {"name": "old", "recipe": "old_plugin:CloseRecipe", "model_path": str(tiny_model_dir), "rollouts": 4,
            "concurrency": 4, "max_pool": 4, "max_tokens": 4, "out_dir": str(tmp_path / "run"), "task": task,
            "recipe_config": {"batch_size": 4, "steps_per_candidate": 1, "selection": "always", "eval_task": task,
                              "eval_size": 2, "eval_max_tokens": 4, "trainer": {"lr": 1e-3, "micro_batch_size": 4}}}
    with pytest.warns(DeprecationWarning) as seen:
        summary = reef_lab.run_experiment(data, progress=False)
    said = [str(w.message) for w in seen]
    assert any("reef_lab.learning.samples.Sample moved: import Sample from reef_lab.trainers.samples" in s
               for s in said), said
    assert any("reef_lab.learning.tasks.Task moved: import Task from reef_lab.tasks.base" in s for s in said)
    assert any("reef_lab.learning.tasks.TaskConfig moved: import TaskConfig from reef_lab.tasks.base" in s
               for s in said)
    assert any("Sample.extra['advantages'] moved: set Sample.advantages" in s for s in said)
    assert summary["releases"] == 1 and summary["serving"] == "old:v1"

    run = reef_lab.read_run(tmp_path / "run")
    assert run.summary == summary and run.config["recipe"] == "old_plugin:CloseRecipe"
    steps = run.events("step")
    assert steps.height == 1 and steps["policy_step"].to_list() == [True]
    assert steps["loss"].is_finite().all() and run.events("release")["release_id"].to_list() == ["old:v1"]
    assert run.records().filter(pl.col("kind") == "report").collect().height == 4
    compared = reef_lab.compare_runs([tmp_path / "run"])
    assert compared.select("run", "recipe", "finished", "releases", "policy_steps").row(0) == \
        ("run", "old_plugin:CloseRecipe", True, 1, 1)


def write_run(folder: Path, name: str, seed: int, final: float | None, rows: list[dict],
              index: dict | None = None) -> Path:
    """A run folder as an experiment leaves it (reef_lab/experiments/driver.py), without running one."""
    (folder / "data" / "learn" / name).mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"name": name, "recipe": "sao", "seed": seed, "out_dir": "x"}))
    if final is not None:
        (folder / "summary.json").write_text(json.dumps({"base_accuracy": 0.25, "final_accuracy": final,
                                                         "wall_s": 60.0}))
    (folder / "data" / "learn" / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if index is not None:
        (folder / "data" / "releases" / name).mkdir(parents=True)
        (folder / "data" / "releases" / name / "index.json").write_text(json.dumps(index))
    return folder


def test_read_run_and_compare_runs(tmp_path):
    rows = [{"event": "eval", "release_id": "base", "accuracy": 0.25},
            {"event": "step", "trainer_step": 1, "loss": 0.5, "policy_step": True, "reward_mean": 0.1},
            {"event": "step", "trainer_step": 2, "loss": 0.25, "policy_step": True, "report_correct": 1},
            {"event": "candidate", "trainer_step": 2, "candidate": "c1", "accuracy": 0.5, "examples": None}]
    index = {"serving": "v1", "base_retention": {"accuracy": 0.75},
             "releases": [{"version": "v1", "retention": {"accuracy": 0.5}}], "candidates": []}
    done = write_run(tmp_path / "a-seed0", "a", 0, 0.5, rows, index)
    going = write_run(tmp_path / "a-seed1", "a", 1, None, rows[:2])
    run = reef_lab.read_run(done)
    assert run.name == "a" and run.summary["final_accuracy"] == 0.5 and run.index["serving"] == "v1"
    assert run.events("step")["loss"].to_list() == [0.5, 0.25]
    assert run.events("step")["report_correct"].to_list() == [None, 1]
    assert run.metrics.height == 4 and run.events("error").height == 0
    assert reef_lab.read_run(going).summary is None and reef_lab.read_run(going).index["releases"] == []

    frame = reef_lab.compare_runs([done, going])
    assert frame.select("run", "seed", "finished", "final_accuracy", "base_retention", "final_retention",
                        "policy_steps").rows() == [("a-seed0", 0, True, 0.5, 0.75, 0.5, 2),
                                                   ("a-seed1", 1, False, None, None, None, 1)]
    assert frame["group"].n_unique() == 1  # the same config but for the seed: one group
    with pytest.raises(FileNotFoundError, match="no config.json"):
        reef_lab.read_run(tmp_path / "nothing")
