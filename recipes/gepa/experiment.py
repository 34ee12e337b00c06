"""GEPA experiments: evolve a harness on a task set's train/validation splits, then score it on a held-out test split.

    python scripts/run_experiment.py recipes/gepa/examples/arithmetic.yaml [--seed N]

The splits come from one data seed (fixed across search seeds, so every seed is tested on the same items) and are
made disjoint by question text. The task model answers greedily behind each candidate harness; the reflection model
(the same or another, e.g. an OpenAI-compatible endpoint) rewrites components. Each new best candidate (by mean
validation score) is published as a harness release of the experiment's scenario in `run_dir/data`, exactly as a
live scenario's would be (and pushed to the Hub when `hub.repo` is set). The run folder holds `events.jsonl` and
`state.json` (the search; re-running the command resumes it), `summary.json`, `heartbeat.json` and the data dir;
apps/gepa.py shows it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

import orjson

from reef_lab.engines.lm import LMSpec, make_lm
from reef_lab.experiments.driver import ExperimentDriver, RunConfig
from reef_lab.learning.heartbeat import Heartbeat
from reef_lab.tasks.base import Task, TaskConfig, make_task
from reef_lab.schema import build

from .search import GEPAConfig, Search, TaskSystem

log = logging.getLogger("reef_lab.gepa_experiment")

DEFAULT_SEED_HARNESS = {"system_prompt.md": "You are a helpful assistant.", "rules.md": "Be accurate."}


@dataclass
class GEPAExperimentConfig(RunConfig):
    name: str = field(default="gepa", metadata={"help": "run name (also the scenario's name)"})
    recipe: str = field(default="gepa", metadata={"help": "always 'gepa' here"})
    task: dict = field(default_factory=dict, metadata={
        "help": "reef_lab.tasks.base.TaskConfig fields; its system_prompt defaults to '' (the harness supplies one)"})
    train_size: int = field(default=32, metadata={"help": "training examples (reflection minibatches)"})
    val_size: int = field(default=16, metadata={"help": "validation examples (the Pareto pool's scores)"})
    test_size: int = field(default=64, metadata={"help": "held-out test examples, scored only at the end"})
    data_seed: int = field(default=1234, metadata={"help": "seed of the splits (the same for every search seed)"})
    seed_harness: dict = field(default_factory=lambda: dict(DEFAULT_SEED_HARNESS), metadata={
        "help": "the harness tree the search starts from {path: text}"})
    search: dict = field(default_factory=dict, metadata={"help": "recipes.gepa.search.GEPAConfig fields"})
    task_lm: dict = field(default_factory=lambda: {"kind": "engine"}, metadata={
        "help": "the task model: {kind: engine} or {kind: openai, base_url, model, key_env} (+ record/replay)"})
    reflection_lm: dict = field(default_factory=lambda: {"kind": "engine"}, metadata={
        "help": "the reflection model, same forms as task_lm"})
    task_max_tokens: int = field(default=48, metadata={"help": "max_tokens of each task answer (greedy)"})
    concurrency: int = field(default=16, metadata={"help": "task answers in flight"})

    def __post_init__(self) -> None:
        self.check_run()
        if min(self.train_size, self.val_size, self.test_size) < 1:
            raise ValueError("train_size, val_size and test_size must be at least 1")
        build(TaskConfig, {"system_prompt": "", **self.task}, "task")  # the task and the LMs, before any model loads
        for key in ("task_lm", "reflection_lm"):
            build(LMSpec, getattr(self, key), key)
        GEPAConfig(**{"seed": self.seed, **self.search})  # refuse a bad search config before any model loads

    def search_config(self) -> GEPAConfig:
        return GEPAConfig(**{"seed": self.seed, **self.search})


def make_splits(task: Task, train: int, val: int, test: int, seed: int) -> tuple[list, list, list]:
    """Disjoint splits by question (an item's `key`, e.g. a multiple-choice question whatever its option order;
    else its text), each drawn from its own seed."""
    seen: set[str] = set()
    out = []

    def key(it: dict) -> str:
        return it.get("key") or it["messages"][-1]["content"]
    for k, n in enumerate((train, val, test)):
        items, extra = [], 0
        while len(items) < n:
            batch = task.items(n + extra, seed=seed * 10 + k)
            items = [it for it in batch if key(it) not in seen][:n]
            extra += n
            if extra > 20 * n:
                raise ValueError("the task cannot supply enough distinct items for these split sizes")
        seen.update(key(it) for it in items)
        out.append([{**it, "id": f"{('train', 'val', 'test')[k]}-{i}"} for i, it in enumerate(items)])
    return out[0], out[1], out[2]


def score_on(system: TaskSystem, harness: dict[str, str], items: list[dict]) -> tuple[float, list]:
    rollouts = system.run(harness, items)
    return sum(r.score for r in rollouts) / len(rollouts), rollouts


def run_gepa_experiment(cfg: GEPAExperimentConfig, engine=None, progress: bool = True) -> dict:
    """Run (or resume) the search and score its best harness on the test split; returns the summary. A given engine
    is left running. Its heartbeat (reef_lab.learning.heartbeat) tells apps/gepa.py it runs while it writes nothing
    else."""
    with Heartbeat(cfg.run_dir):
        return GEPAExperiment(cfg, engine).run(progress)


class GEPAExperiment(ExperimentDriver):
    cfg: GEPAExperimentConfig

    def __init__(self, cfg: GEPAExperimentConfig, engine=None):
        super().__init__(cfg, engine, close_engine=engine is None)

    def loop(self, progress: bool) -> dict:
        cfg, run_dir = self.cfg, self.run_dir
        needs_engine = any(not spec.get("replay") and spec.get("kind", "engine") == "engine"
                           for spec in (cfg.task_lm, cfg.reflection_lm))
        engine = self.build_engine(cfg.concurrency, lora=False) if needs_engine else self.engine
        task = make_task({"system_prompt": "", **cfg.task})
        train, val, test = make_splits(task, cfg.train_size, cfg.val_size, cfg.test_size, cfg.data_seed)
        system = TaskSystem(make_lm(cfg.task_lm, engine), cfg.task_max_tokens, cfg.concurrency, task=task)
        reflection = make_lm(cfg.reflection_lm, engine)
        ctx, tracker = None, None
        serving_engine = engine
        if serving_engine is None and cfg.task_lm.get("kind") == "openai" and not cfg.task_lm.get("replay"):
            from reef_lab.engines.upstream import UpstreamEngine  # the provider that would serve these harnesses

            serving_engine = UpstreamEngine(cfg.task_lm["base_url"], cfg.task_lm["model"])
            self.owned.append(serving_engine)
        if serving_engine is not None:  # releases go to a data dir like a live scenario's (none when replaying)
            ctx = self.open(serving_engine, tracking=False)
        if cfg.wandb:
            from reef_lab.publishing.tracking import Tracker, TrackingConfig

            tc = TrackingConfig(**{"group": cfg.name, "name": f"{cfg.name}-seed{cfg.seed}", **cfg.wandb})
            tracker = Tracker(tc.name, {"experiment": asdict(cfg)}, tc, run_dir)
            self.owned.append(tracker)
        released = {"best": None}

        def on_event(row: dict) -> None:
            if tracker is not None:
                tracker.log(row)
            if row["event"] == "front" and ctx is not None and row["best"] != released["best"]:
                best = search.cands[row["best"]]
                released["best"] = best.id
                rel = ctx.publish_harness(best.components, {
                    "recipe": "gepa", "gepa": {"candidate": best.id, "parents": best.parents,
                                               "changed": best.changed, "val_mean": best.mean,
                                               "metric_calls": search.metric_calls}},
                    scores={"accuracy": best.mean, "size": len(best.scores)})["release"]
                search.event({"event": "release", "release_id": rel["release_id"], "candidate": best.id})

        started = time.time()
        search = Search(cfg.search_config(), system, reflection, train, val, cfg.seed_harness, run_dir, on_event)
        if search.cands:  # resumed: the serving release already names the best so far
            released["best"] = search.best().id
        best = search.run(progress=progress)
        seed_test, seed_rollouts = score_on(system, search.cands[0].components, test)
        best_test, best_rollouts = score_on(system, best.components, test)
        summary = {"name": cfg.name, "seed": cfg.seed, "metric_calls": search.metric_calls,
                   "budget": search.config.max_metric_calls, "iterations": search.iteration,
                   "candidates": len(search.cands), "seed_val": search.cands[0].mean, "best_val": best.mean,
                   "best_candidate": best.id, "seed_test": seed_test, "best_test": best_test,
                   "test_size": len(test), "best_harness": best.components,
                   "serving": ctx.releases()["serving"] if ctx else None,
                   "wall_s": round(time.time() - started, 1)}
        (run_dir / "test_answers.jsonl").write_bytes(b"".join(orjson.dumps(
            {"candidate": c, "example": r.example_id, "question": r.question, "score": r.score, "output": r.output,
             "feedback": r.feedback}) + b"\n"
            for c, rs in (("seed", seed_rollouts), ("best", best_rollouts)) for r in rs))
        if tracker is not None:
            tracker.log({"event": "test", "seed_test": seed_test, "best_test": best_test,
                         "metric_calls": search.metric_calls})
        return summary
