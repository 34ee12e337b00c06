"""Run and inspect SAO / GRPO experiments: launch one, or open a finished (or running) one and plot it.

    marimo edit apps/sao.py            # notebook
    marimo run apps/sao.py             # as an app
    REEF_LAB_RUN=runs/compare/sao-arithmetic-seed0 marimo export html apps/sao.py -o out.html   # headless

A run is a folder written by scripts/run_experiment.py (reef_lab/learning/experiment.py): `config.json`, `summary.json`
when finished, and the learner's `data/learn/<scenario>/metrics.jsonl`, which is all this app reads. Plots per
policy step: batch reward, held-out accuracy (each candidate), loss, masked-token fraction (DIS) and value error
(SAO), with a dashed line where a release went live. Launching starts the experiment as a child process that keeps
running if the app closes; re-open its folder to follow it.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab SAO / GRPO")

with app.setup:
    from pathlib import Path

    import marimo as mo
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import orjson
    import polars as pl

    from reef_lab.learning.experiment import launch_detached, run_choices
    from reef_lab.learning.learner import read_metrics

    ROOT = Path(__file__).resolve().parents[1]
    PANELS = [("reward_mean", "batch reward"), ("accuracy", "held-out accuracy"), ("loss", "policy loss"),
              ("masked_fraction", "masked-token fraction"), ("value_abs_error", "value error |V - target|")]


@app.function
def find_runs(root: Path) -> list[str]:
    """Run folders (holding config.json) under `root`, newest first."""
    if not root.exists():
        return []
    runs = [p.parent for p in root.rglob("config.json") if (p.parent / "data").exists()]
    return [str(p) for p in sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True)]


@app.function
def load_run(run_dir: str | Path) -> dict | None:
    """A run's config, summary, per-step metrics, candidates and releases as polars frames; None while the folder
    holds no run (a launch that has not written its config yet, or a wrong path)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        return None
    config = orjson.loads((run_dir / "config.json").read_bytes())
    summary_file = run_dir / "summary.json"
    summary = orjson.loads(summary_file.read_bytes()) if summary_file.exists() else None
    rows = read_metrics(run_dir / "data" / "learn" / config["name"] / "metrics.jsonl")

    def frame(event: str, cols: list[str]) -> pl.DataFrame:
        picked = [{c: r.get(c) for c in cols} for r in rows if r["event"] == event]
        return pl.DataFrame(picked, schema={c: (pl.String if c in ("phase", "release_id", "candidate", "status")
                                                else pl.Float64) for c in cols}, strict=False)

    steps = frame("step", ["trainer_step", "phase", "reward_mean", "loss", "masked_fraction", "value_abs_error",
                           "grad_norm", "staleness_mean", "step_s", "time"])
    steps = steps.with_row_index("batch", offset=1)
    candidates = frame("candidate", ["trainer_step", "candidate", "status", "accuracy", "serving_accuracy", "time"])
    releases = frame("release", ["trainer_step", "release_id", "accuracy", "swap_s", "time"])
    base = next((r["accuracy"] for r in rows if r["event"] == "eval" and r.get("release_id") == "base"), None)
    errors = [r for r in rows if r["event"] == "error"]
    return {"dir": str(run_dir), "config": config, "summary": summary, "steps": steps, "candidates": candidates,
            "releases": releases, "base_accuracy": base, "errors": errors}


@app.function
def plot_run(run: dict):
    """Five panels against the trainer's policy step, with release markers."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    steps, cands = run["steps"], run["candidates"]
    for ax, (col, title) in zip(axes, PANELS, strict=True):
        if col == "accuracy":
            xs = ([0.0] if run["base_accuracy"] is not None else []) + cands["trainer_step"].to_list()
            ys = ([run["base_accuracy"]] if run["base_accuracy"] is not None else []) + cands["accuracy"].to_list()
            ax.plot(xs, ys, marker="o")
        else:
            data = steps.filter(pl.col(col).is_not_null())
            x = data["trainer_step"] if col not in ("reward_mean", "value_abs_error") else data["batch"]
            ax.plot(x.to_list(), data[col].to_list(), marker=".")
            if col in ("reward_mean", "value_abs_error"):
                ax.set_xlabel("training batch")
        for step in run["releases"]["trainer_step"].to_list():
            if col not in ("reward_mean", "value_abs_error"):
                ax.axvline(step, color="grey", linestyle="--", alpha=0.5)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if not ax.get_xlabel():
            ax.set_xlabel("policy step")
    fig.tight_layout()
    return fig


@app.cell
def _():
    mo.md("# SAO / GRPO experiments")
    return


@app.cell
def _():
    recipe_ui = mo.ui.dropdown(["sao", "grpo"], value="sao", label="recipe")
    seed_ui = mo.ui.number(0, 1000, value=0, label="seed")
    rollouts_ui = mo.ui.number(16, 100_000, step=16, value=256, label="rollouts")
    lr_ui = mo.ui.text(value="1e-5", label="learning rate")
    out_ui = mo.ui.text(value="runs/app", label="runs folder")
    launch_ui = mo.ui.run_button(label="launch")
    mo.vstack([mo.md("## Launch a run"), mo.hstack([recipe_ui, seed_ui, rollouts_ui, lr_ui, out_ui, launch_ui])])
    return launch_ui, lr_ui, out_ui, recipe_ui, rollouts_ui, seed_ui


@app.cell
def _(launch_ui, lr_ui, out_ui, recipe_ui, rollouts_ui, seed_ui):
    launched = None
    if launch_ui.value:
        _dir = Path(out_ui.value) / f"{recipe_ui.value}-seed{int(seed_ui.value)}"
        _proc = launch_detached(ROOT / f"recipes/{recipe_ui.value}/examples/arithmetic.yaml", int(seed_ui.value), _dir,
                                {"rollouts": int(rollouts_ui.value), "recipe_config.trainer.lr": float(lr_ui.value)},
                                root=ROOT)
        launched = str(_dir)
        mo.output.replace(mo.md(f"Started pid {_proc.pid}, writing `{_dir}` (log: `{_dir}/run.log`)."))
    return (launched,)


@app.cell
def _(launched):
    _options = run_choices(find_runs(ROOT / "runs"), launched)
    run_ui = mo.ui.dropdown(_options, value=_options[0] if _options else None, label="run folder")
    refresh_ui = mo.ui.refresh(default_interval="10s", label="refresh")
    mo.vstack([mo.md("## Open a run"), mo.hstack([run_ui, refresh_ui])])
    return refresh_ui, run_ui


@app.cell
def _(refresh_ui, run_ui):
    refresh_ui.value
    run = load_run(run_ui.value) if run_ui.value else None
    if run is None:
        _out = mo.md("_No run folder yet: launch one above or run scripts/run_experiment.py._")
    else:
        _s = run["summary"]
        _head = (f"**{run['config']['name']}** ({run['config']['recipe']}, seed {run['config']['seed']}): "
                 f"{run['steps'].height} training batches, {run['candidates'].height} candidates, "
                 f"{run['releases'].height} releases; base held-out accuracy {run['base_accuracy']}")
        if _s:
            _head += f"; final {_s['final_accuracy']} after {_s['rollouts']} rollouts ({_s['wall_s'] / 60:.1f} min)"
        else:
            _head += " (running or unfinished)"
        _out = mo.vstack([mo.md(_head), plot_run(run),
                          mo.md("### Candidates"), mo.ui.table(run["candidates"].to_dicts(), selection=None),
                          mo.md("### Steps"), mo.ui.table(run["steps"].to_dicts(), selection=None)]
                         + ([mo.md(f"### Errors\n{run['errors']}")] if run["errors"] else []))
    _out
    return (run,)


if __name__ == "__main__":
    app.run()
