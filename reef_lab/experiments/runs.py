"""Reading run folders: one run, and several side by side. A notebook, the apps (apps/sao.py) and
scripts/studies/compare_recipes.py read runs through these functions, so they agree on what a run says.

    from reef_lab import compare_runs, read_run
    run = read_run("runs/compare/sao-arithmetic-seed0")
    run.summary["final_accuracy"], run.events("candidate"), run.records().collect()
    compare_runs(["runs/compare/sao-arithmetic-seed0", "runs/compare/grpo-arithmetic-seed0"])

A run folder is what an experiment writes (reef_lab/experiments/driver.py): `config.json` when it starts,
`summary.json` when it finished, and the data dir `data/` of its scenario (named by the config's `name`): the
learner's metrics rows `data/learn/<name>/metrics.jsonl`, the release index `data/releases/<name>/index.json` and the
records. Reading never writes, so it is safe while the run goes on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import orjson
import polars as pl

from reef_lab.learning.learner import read_metrics
from reef_lab.records.segments import scan_records

NO_RELEASES = {"serving": None, "releases": [], "candidates": []}  # the index of a scenario with no release yet


@dataclass
class Run:
    """One run folder as read at one moment."""

    folder: Path
    config: dict  # config.json: the experiment's config as it ran
    summary: dict | None  # summary.json; None until the run finished (a failed run writes none)
    index: dict  # the scenario's release index: serving, releases, candidates (each with its eval and retention)
    rows: list[dict]  # the learner's metrics rows as written, oldest first (each has an `event`)

    @property
    def name(self) -> str:
        """The run's name, which is its scenario's."""
        return self.config["name"]

    @property
    def data_dir(self) -> Path:
        return self.folder / "data"

    @property
    def metrics(self) -> pl.DataFrame:
        """Every metrics row, a column per key any row has (null where a row has none)."""
        if not self.rows:
            return pl.DataFrame(schema={"event": pl.String})
        return pl.from_dicts(self.rows, infer_schema_length=None)

    def events(self, event: str) -> pl.DataFrame:
        """The metrics rows of one event: `step` (a training batch), `candidate`, `release`, `eval` (the base
        model's held-out and retention scores) or `error`."""
        return self.metrics.filter(pl.col("event") == event)

    def records(self) -> pl.LazyFrame:
        """The run's records (its scenario's inferences, reports and training rows) as a polars LazyFrame."""
        return scan_records(self.data_dir).filter(pl.col("scenario") == self.name)


def read_run(folder: str | Path) -> Run:
    """The run in `folder`; FileNotFoundError when it holds none (no config.json: a wrong path, or a launch that has
    not started yet)."""
    folder = Path(folder)
    config = _json(folder / "config.json")
    if config is None:
        raise FileNotFoundError(f"{folder} holds no run: no config.json (an experiment writes it when it starts)")
    name = config["name"]
    return Run(folder=folder, config=config, summary=_json(folder / "summary.json"),
               index=_json(folder / "data" / "releases" / name / "index.json") or dict(NO_RELEASES),
               rows=read_metrics(folder / "data" / "learn" / name / "metrics.jsonl"))


def config_group(config: dict) -> str:
    """`<name>-<digest>` of a run's config: runs in one group differ only in seed and where they write, push and
    log, so their numbers are repeats of one setting."""
    same = {k: v for k, v in config.items() if k not in ("seed", "out_dir", "hub", "wandb")}
    return f"{config['name']}-{hashlib.sha1(orjson.dumps(same, option=orjson.OPT_SORT_KEYS)).hexdigest()[:6]}"


def compare_runs(folders: list[str | Path]) -> pl.DataFrame:
    """One row per run, in the order given: its recipe, seed and group (config_group), whether it finished, the base
    model's and the final release's held-out accuracy (from summary.json: null until it finished), the retention
    task's for both (from the release index: null where the run scored none), its releases, policy steps and wall
    time."""
    rows = []
    for folder in folders:
        run = read_run(folder)
        summary = run.summary or {}
        serving = next((r for r in run.index.get("releases", []) if r.get("version") == run.index.get("serving")), {})
        rows.append({
            "run": run.folder.name, "name": run.name, "recipe": run.config.get("recipe"),
            "seed": run.config.get("seed"), "group": config_group(run.config), "finished": run.summary is not None,
            "base_accuracy": summary.get("base_accuracy"), "final_accuracy": summary.get("final_accuracy"),
            "base_retention": (run.index.get("base_retention") or {}).get("accuracy"),
            "final_retention": (serving.get("retention") or {}).get("accuracy"),
            "releases": len(run.index.get("releases", [])),
            "policy_steps": sum(1 for r in run.rows if r.get("event") == "step" and r.get("policy_step")),
            "wall_s": summary.get("wall_s"), "folder": str(run.folder)})
    return pl.DataFrame(rows, schema={
        "run": pl.String, "name": pl.String, "recipe": pl.String, "seed": pl.Int64, "group": pl.String,
        "finished": pl.Boolean, "base_accuracy": pl.Float64, "final_accuracy": pl.Float64,
        "base_retention": pl.Float64, "final_retention": pl.Float64, "releases": pl.Int64, "policy_steps": pl.Int64,
        "wall_s": pl.Float64, "folder": pl.String})


def _json(path: Path) -> dict | None:
    return orjson.loads(path.read_bytes()) if path.is_file() else None
