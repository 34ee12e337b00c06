"""Launch or open a TTT-Discover run (recipes/tttd): best-so-far and mean reward per step, beta per group, the PUCT
archive as a tree, and the best solution drawn.

    marimo run apps/ttt.py                                   # runs under ./runs
    REEF_LAB_RUNS=runs/tttd-compare marimo run apps/ttt.py   # runs under another folder
    REEF_LAB_RUN=runs/tttd-compare/ttt-seed0 marimo run apps/ttt.py

A run is a folder `scripts/run_experiment.py recipes/tttd/examples/<problem>.yaml` wrote: its scenario's state sits
in `data/learn/<name>/` (metrics.jsonl, archive.json, state.json, best_solution.py). Read-only; auto-refresh
re-reads only when those files changed, and keeps what is picked.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab TTT-Discover")

with app.setup:
    import os
    from pathlib import Path

    import marimo as mo
    import orjson
    import polars as pl

    ROOT = Path(__file__).resolve().parents[1]

    from apps.shared import (STEP, figure, fit_axes, progress_html, run_status, signature, svg, tidy, wandb_md,
                             wandb_runs)
    from recipes.tttd.archive import Archive
    from recipes.tttd.problems import make_problem
    from apps.launch import launch_detached
    from reef_lab import read_metrics

    STATE_FILES = ("metrics.jsonl", "archive.json", "state.json", "best.json", "summary.json", "run.pid")


@app.function
def find_runs(root: Path) -> list[str]:
    """Run folders under `root` holding a TTT-Discover scenario (data/learn/<name>/archive.json), newest first."""
    found = {p.parents[3] for p in Path(root).glob("**/data/learn/*/archive.json")} if Path(root).exists() else set()
    return [str(p) for p in sorted(found, key=lambda p: -p.stat().st_mtime)]


@app.function
def load_run(run_dir: str) -> dict | None:
    """Everything the views draw from one run folder (None when it holds no TTT-Discover scenario yet)."""
    learn = sorted(Path(run_dir).glob("data/learn/*/archive.json"))
    if not learn:
        return None
    folder = learn[0].parent
    rows = read_metrics(folder / "metrics.jsonl")  # what a notebook reads (reef_lab.read_metrics)
    config = orjson.loads((Path(run_dir) / "config.json").read_bytes()) if (Path(run_dir) / "config.json").exists() \
        else {}
    summary_path = Path(run_dir) / "summary.json"
    return {"dir": run_dir, "folder": str(folder), "name": folder.name, "rows": rows, "config": config,
            "archive": Archive.from_dict(orjson.loads(learn[0].read_bytes())),
            "state": orjson.loads((folder / "state.json").read_bytes()) if (folder / "state.json").exists() else {},
            "summary": orjson.loads(summary_path.read_bytes()) if summary_path.exists() else None}


@app.function
def status_of(run_dir: str) -> str:
    """running, finished, failed or stopped (apps.shared.run_status: the run's heartbeat first)."""
    learn = sorted(Path(run_dir).glob("data/learn/*/archive.json"))
    activity = [learn[0].parent / f for f in ("metrics.jsonl", "archive.json")] if learn else []
    return run_status(run_dir, (Path(run_dir) / "summary.json").exists(), activity)


@app.function
def circles_of(solution: str, problem: dict) -> list[tuple[float, float, float]] | None:
    """The circles a solution stands for, as the run's problem verifies it (a program runs in the sandbox)."""
    try:
        return make_problem(problem or {}).circles(solution)
    except ValueError:  # a config this version does not know
        return None


@app.function
def plot_progress(run: dict):
    rows, fig_axes = run["rows"], figure(1080, 330, 1, 2)
    fig, axes = fig_axes
    ax, bx = axes[0]
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["best_reward"] for r in rows], marker="o", label="best so far")
    ax.plot(steps, [r["mean_reward"] for r in rows], marker=".", label="mean of the step's samples")
    ax.plot(steps, [r["step_best"] for r in rows], ls=":", label="best of the step's samples")
    known = next((r.get("best_known") for r in rows if r.get("best_known")), None)
    if known:
        ax.axhline(known, color="black", ls="--", lw=1, label=f"best known {known:.4f}")
    ax.set(xlabel=STEP, ylabel="reward (sum of radii; invalid = 0)", title="reward")
    ax.legend(loc="lower right")
    fit_axes(ax, steps, [r[k] for r in rows for k in ("best_reward", "mean_reward", "step_best")] + [known or None])
    betas = [b for r in rows for b in (r.get("betas") or []) if b is not None]
    for r in rows:
        for g, beta in enumerate(r.get("betas") or []):
            if beta is not None:
                bx.scatter(r["step"], beta, color=f"C{g % 10}", s=24)
        dropped = sum(b is None for b in r.get("betas") or [])
        if dropped:
            bx.annotate(f"{dropped} dropped", (r["step"], 0), fontsize=11, ha="center", va="bottom",
                        xycoords=("data", "axes fraction"))
    bx.set(xlabel=STEP, ylabel="beta (KL = ln 2)", title="beta per group (colour: group)")
    if any(betas):
        bx.set_yscale("log")
    fit_axes(bx, steps, betas)
    return svg(fig, "ttt-progress")


@app.function
def row_step(state) -> int:
    """The metrics row (`step`) whose sampling made `state`: the archive counts from 0 (-1: an initial state), the
    rows from 1, and every chart numbers steps as the rows do."""
    return state.step + 1


@app.function
def plot_tree(archive: Archive):
    """States by step (x) and reward (y), an edge from each parent; colour: PUCT score; ring: next parents."""
    fig, axes = figure(1080, 380)
    ax = axes[0][0]
    scores = {s.state.id: s.score for s in archive.scores()}
    chosen = {s.id for s in archive.select(min(4, len(archive)))} if len(archive) else set()
    states = archive.states
    for s in states.values():
        if s.parent in states:
            p = states[s.parent]
            ax.plot([row_step(p), row_step(s)], [p.reward, s.reward], color="0.7", lw=0.8, zorder=1)
    xs = [row_step(s) for s in states.values()]
    ys = [s.reward for s in states.values()]
    cs = [scores.get(s.id, 0) for s in states.values()]
    pts = ax.scatter(xs, ys, c=cs, cmap="viridis", s=36, zorder=2)
    ring = [s for s in states.values() if s.id in chosen]
    ax.scatter([row_step(s) for s in ring], [s.reward for s in ring], facecolors="none", edgecolors="red", s=110,
               zorder=3, label="PUCT's next parents")
    fig.colorbar(pts, ax=ax, label="PUCT score")
    ax.set(xlabel=f"{STEP} that sampled the state (0: initial)", ylabel="reward",
           title=f"archive: {len(states)} states, {archive.expansions} expansions")
    ax.legend(loc="lower right")
    fit_axes(ax, xs, ys)
    return svg(fig, "ttt-tree")


@app.function
def plot_circles(circles, title: str):
    import matplotlib.patches as patches

    fig, axes = figure(420, 420)
    ax = axes[0][0]
    ax.add_patch(patches.Rectangle((0, 0), 1, 1, fill=False, lw=1.5))
    for k, (x, y, r) in enumerate(circles):
        ax.add_patch(patches.Circle((x, y), r, alpha=0.45, color=f"C{k % 10}"))
        ax.text(x, y, f"{r:.3f}", ha="center", va="center", fontsize=11)
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), aspect="equal", title=title)
    return svg(fig, "ttt-best")


@app.function
def archive_frame(archive: Archive, top: int = 20) -> pl.DataFrame:
    rows = [{"state": s.state.id, "step": s.state.step, "reward": s.state.reward, "Q": s.q, "prior": s.prior,
             "bonus": s.bonus, "PUCT": s.score, "visits": s.state.visits, "parent": s.state.parent or "",
             "children": len(s.state.children)} for s in archive.scores()[:top]]
    return tidy(pl.DataFrame(rows)) if rows else pl.DataFrame()


@app.cell
def _():
    mo.md("# TTT-Discover").center()
    return


@app.cell
def _():
    examples = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes/tttd/examples").glob("*.yaml"))
    example_ui = mo.ui.dropdown(examples, value=examples[0] if examples else None, label="example")
    seed_ui = mo.ui.number(start=0, stop=10_000, value=0, label="seed")
    out_ui = mo.ui.text(value="runs/tttd-app", label="run folder")
    launch_ui = mo.ui.run_button(label="launch")
    mo.vstack([mo.md("## Launch"), mo.hstack([example_ui, seed_ui, out_ui, launch_ui], justify="start")])
    return example_ui, launch_ui, out_ui, seed_ui


@app.cell
def _(example_ui, launch_ui, out_ui, seed_ui):
    launched = None
    if launch_ui.value and example_ui.value:
        _dir = Path(out_ui.value) / f"seed{int(seed_ui.value)}"
        launch_detached(ROOT / example_ui.value, int(seed_ui.value), _dir, None, root=ROOT)
        launched = str(_dir)
    mo.md(f"Launched into `{launched}` (log: `{launched}/run.log`); it appears below once it has written its "
          "first state." if launched else "")
    return (launched,)


@app.cell
def _():
    root_ui = mo.ui.text(value=os.environ.get("REEF_LAB_RUNS") or "runs", label="runs under")
    refresh_ui = mo.ui.refresh(options=["5s", "10s", "30s"], default_interval="10s", label="auto-refresh")
    mo.vstack([mo.md("## Runs"), mo.hstack([root_ui, refresh_ui], widths=[6, 1], align="end")])
    return refresh_ui, root_ui


@app.cell
def _():
    get_runs, set_runs = mo.state([])
    get_sig, set_sig = mo.state(())
    return get_runs, get_sig, set_runs, set_sig


@app.cell
def _(get_runs, launched, refresh_ui, root_ui, set_runs):
    refresh_ui.value
    _found = find_runs(Path(root_ui.value))
    _pinned = os.environ.get("REEF_LAB_RUN")
    for _extra in (_pinned, launched):
        if _extra and _extra not in _found:
            _found.insert(0, _extra)
    if _found != get_runs():
        set_runs(_found)
    return


@app.cell
def _(get_runs):
    _runs = get_runs()
    _pinned = os.environ.get("REEF_LAB_RUN")
    run_ui = mo.ui.dropdown(_runs, value=_pinned if _pinned in _runs else (_runs[0] if _runs else None),
                            label="run")
    run_ui
    return (run_ui,)


@app.cell
def _(get_sig, refresh_ui, run_ui, set_sig):
    refresh_ui.value
    # the status too: a run that dies (or goes quiet while alive) changes it without writing a file
    _sig = (run_ui.value, signature(run_ui.value, STATE_FILES), status_of(run_ui.value)) if run_ui.value else ()
    if _sig != get_sig():
        set_sig(_sig)  # the views below redraw only now
    return


@app.cell
def _(get_sig):
    _sig = get_sig()
    run = load_run(_sig[0]) if _sig else None
    return (run,)


@app.cell
def _(run):
    if run is None:
        _out = mo.md("No TTT-Discover run yet: launch one above, or point *runs under* at a folder holding one.")
    else:
        _cfg = (run["config"].get("config") or {})
        _steps = int(_cfg.get("steps") or 0) or max((r["step"] for r in run["rows"]), default=0)
        _done = int(run["state"].get("step", 0))
        _status = status_of(run["dir"])
        _best = run["archive"].best()
        _known = next((r.get("best_known") for r in run["rows"] if r.get("best_known")), None)
        _last = run["rows"][-1] if run["rows"] else {}
        _lines = [f"**{run['name']}**: {_status}; {progress_html(_done, _steps, 'steps')}",
                  f"best reward **{_best.reward:.6f}** (state `{_best.id}`, step {_best.step})"
                  + (f", best known {_known:.6f} ({100 * _best.reward / _known:.1f}%)" if _known else ""),
                  f"last step: mean {_last.get('mean_reward', 0):.3f}, valid {_last.get('valid_fraction', 0):.2f}, "
                  f"{_last.get('samples', 0)} samples trained, release `{_last.get('release', '-')}`"
                  if _last else "no step finished yet",
                  f"final release: `{run['state'].get('released')}`" if run["state"].get("released") else "",
                  wandb_md(wandb_runs(Path(run["dir"]) / "data"))]
        _out = mo.md("  \n".join(x for x in _lines if x))
    _out
    return


@app.cell
def _(run):
    (mo.vstack([mo.md("## Reward and beta per step"), plot_progress(run)])
     if run is not None and run["rows"] else mo.md(""))
    return


@app.cell
def _(run):
    if run is not None:
        _best = run["archive"].best()
        _circles = circles_of(_best.solution, (run["config"].get("config") or {}).get("problem") or {})
        _pic = plot_circles(_circles, f"best: {_best.reward:.6f}") if _circles else mo.md("(not a circle packing)")
        _out = mo.vstack([mo.md("## Best solution"), mo.hstack([_pic, mo.md(f"```python\n{_best.solution}\n```")],
                                                                 widths=[1, 1], align="start")])
    else:
        _out = mo.md("")
    _out
    return


@app.cell
def _(run):
    (mo.vstack([mo.md("## Archive"), plot_tree(run["archive"]),
                mo.md("Top states by PUCT score (Q: best child's reward, or its own before any; prior: rank-based; "
                      "bonus: c * scale * prior * sqrt(1 + T) / (1 + visits))"),
                mo.ui.table(archive_frame(run["archive"]), selection=None, page_size=10)])
     if run is not None else mo.md(""))
    return


if __name__ == "__main__":
    app.run()
