"""Run, follow and compare weight experiments (SAO, GRPO, SFT, the distillation recipes): launch one, open one, or
overlay several (seeds, recipes).

    marimo run apps/sao.py                                   # as an app (marimo edit: as a notebook)
    REEF_LAB_RUNS=runs/compare marimo run apps/sao.py        # list the runs under another folder
    REEF_LAB_RUN=runs/compare/sao-arithmetic-seed0 marimo export html apps/sao.py -o out.html   # headless

A run is a folder written by scripts/run_experiment.py (reef_lab/experiments/weights.py): `config.json`,
`rollouts.jsonl`, `summary.json` when finished, the learner's `data/learn/<scenario>/metrics.jsonl`, the release
index `data/releases/<scenario>/index.json` (with each release's Hub revision) and the W&B run under `data/wandb`.
The launch form starts from the example's own values, so launching it unchanged runs the published config (only
changed fields become `--set` overrides); the run is a detached child that outlives the app. The runs table gives
each run's status (from its heartbeat: docs/apps.md) and progress; tick several to overlay their curves, with each group's mean and 95% band
(a group: runs whose configs differ only in seed) and the config fields that differ. One run in detail: every
panel against the policy step, held-out accuracy with 95% Wilson intervals, releases as dashed lines, each
candidate's sample held-out answers next to its accuracy, a distillation run's divergence and teacher-student gap,
links to its W&B folder and Hub revisions. Auto-refresh re-reads only when a run's files changed, and keeps every choice.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab weight experiments")

with app.setup:
    import html
    import os
    from pathlib import Path

    import marimo as mo
    import orjson
    import polars as pl
    import yaml

    ROOT = Path(__file__).resolve().parents[1]

    from apps.shared import (STEP, answers_html, eval_answers, figure, fit_axes, hub_cell, link, mean_ci, progress_html,
                             run_status, shown, signature, svg, tidy, utc, wandb_md, wandb_runs, wilson)
    from apps.launch import launch_detached, run_choices, yaml_value
    from reef_lab import read_run
    from reef_lab.experiments.runs import config_group

    PANELS = [("reward_mean", "batch reward"),
              ("accuracy", "held-out and retention accuracy (95% CI)"), ("loss", "policy loss"),
              ("masked_fraction", "masked-token fraction"), ("value_abs_error", "value error |V - target|"),
              ("staleness_mean", "staleness (policy steps)")]
    # Titles of the numbers reports carry in metadata, averaged per step by the learner (`report_<key>`); any other
    # key gets a generic title.
    REPORT_PANELS = {"report_valid_call_fraction": "tool-call validity (valid calls / calls)",
                     "report_correct": "task success (answer correct)",
                     "report_valid_calls": "valid tool calls per episode",
                     "report_invalid_calls": "invalid tool calls per episode"}
    # What a distillation run's steps carry (reef_lab.learning.distill.distill_step; ctxd: the prompt it saves).
    DISTILL_PANELS = {"reverse_kl": "reverse KL(student || teacher) per token",
                      "forward_kl": "forward KL(teacher || student), teacher's top-K",
                      "jsd": "JSD(teacher, student), teacher's top-K",
                      "teacher_gap": "teacher - student log-prob, generated tokens",
                      "prompt_tokens_saved": "prompt tokens saved per call (context distilled)"}
    RUN_FILES = ("config.json", "summary.json", "rollouts.jsonl", "metrics.jsonl", "index.json", "run.log",
                 "run.pid")
    # The experiment configs of the weight recipes (live.yaml is a recipe config, not an experiment); the one
    # behind results/sao-arithmetic.md first.
    EXAMPLES = sorted((str(p.relative_to(ROOT)) for r in ("sao", "grpo")
                       for p in (ROOT / "recipes" / r / "examples").glob("*.yaml")
                       if "recipe" in (yaml.safe_load(p.read_text()) or {})),
                      key=lambda s: (s != "recipes/sao/examples/arithmetic.yaml", s))
    LOADED: dict = {}  # run folder -> (its files' signature, the loaded run)


@app.function
def find_runs(root: Path) -> list[str]:
    """Run folders of weight experiments (config.json with a rollout budget, and a data dir) under `root`, newest
    first."""
    if not root.exists():
        return []
    runs = [p.parent for p in root.rglob("config.json") if (p.parent / "data").exists()
            and "rollouts" in orjson.loads(p.read_bytes())]  # a weight experiment's, not a GEPA search's
    return [str(p) for p in sorted(runs, key=lambda p: p.stat().st_mtime, reverse=True)]


@app.function
def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


@app.function
def load_run(run_dir: str | Path) -> dict | None:
    """A run's config, summary, per-step metrics, candidates and releases (polars frames), its release index,
    progress, status and W&B folders; None while the folder holds no run (a launch that has not written its config
    yet, or a wrong path). Re-read only when one of its files changed."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        return None
    sig = signature(run_dir, RUN_FILES)
    if run_dir in LOADED and LOADED[run_dir][0] == sig:
        run = LOADED[run_dir][1]
        return {**run, "status": status_of(run_dir, run["config"], run["summary"] is not None)}
    read = read_run(run_dir)  # what a notebook reads (reef_lab.experiments.runs)
    config, summary, rows, index = read.config, read.summary, read.rows, read.index

    def frame(event: str, cols: list[str]) -> pl.DataFrame:
        picked = [{c: r.get(c) for c in cols} for r in rows if r["event"] == event]
        return pl.DataFrame(picked, schema={c: (pl.String if c in ("phase", "release_id", "candidate", "status")
                                                else pl.Int64 if c == "n" else pl.Float64) for c in cols},
                            strict=False)

    reported = sorted({k for r in rows if r["event"] == "step" for k in r if k.startswith("report_")})
    distilled = [k for k in DISTILL_PANELS if any(r["event"] == "step" and r.get(k) is not None for r in rows)]
    steps = frame("step", ["trainer_step", "phase", "reward_mean", "loss", "masked_fraction", "value_abs_error",
                           "grad_norm", "staleness_mean", "step_s", "time", *reported, *distilled])
    steps = steps.with_row_index("batch", offset=1)
    # How many held-out items each accuracy is over: the evaluation's own count (a metrics row keeps only a sample
    # of its examples), else the config's eval_size (LearnConfig's default 64).
    eval_n = (config.get("recipe_config") or {}).get("eval_size", 64)
    counted = {c["id"]: (c.get("eval") or {}).get("n") for c in index["candidates"]}
    kept_n = {c["id"]: (c.get("retention") or {}).get("n") for c in index["candidates"]}
    retention_n = (config.get("recipe_config") or {}).get("retention_size", 32)
    for r in rows:
        if r["event"] == "candidate":
            r["n"] = counted.get(r.get("candidate")) or eval_n
            r["retention_n"] = kept_n.get(r.get("candidate")) or retention_n
    candidates = frame("candidate", ["trainer_step", "candidate", "status", "accuracy", "n", "serving_accuracy",
                                     "retention_accuracy", "retention_n", "time"])
    releases = frame("release", ["trainer_step", "release_id", "accuracy", "swap_s", "time"])
    base_rows = [r for r in rows if r["event"] == "eval" and r.get("release_id") == "base"]
    base = next((r["accuracy"] for r in base_rows if r.get("accuracy") is not None), None)
    base_kept = next((r["retention_accuracy"] for r in base_rows if r.get("retention_accuracy") is not None), None)
    done = count_lines(run_dir / "rollouts.jsonl")
    run = {"dir": str(run_dir), "config": config, "summary": summary, "steps": steps, "reported": reported,
           "distilled": distilled,
           "candidates": candidates,
           "releases": releases, "base_accuracy": base, "eval_n": eval_n, "index": index,
           "base_retention": base_kept, "retention_n": retention_n,
           "errors": [r for r in rows if r["event"] == "error"], "rollouts_done": done,
           "rollouts_total": config.get("rollouts", 0), "wandb": wandb_runs(run_dir / "data"),
           "status": status_of(run_dir, config, summary is not None)}
    LOADED[run_dir] = (sig, run)
    return run


@app.function
def status_of(run_dir: Path, config: dict, finished: bool) -> str:
    metrics_file = run_dir / "data" / "learn" / config["name"] / "metrics.jsonl"
    return run_status(run_dir, finished, [metrics_file, run_dir / "rollouts.jsonl"])


@app.function
def watch_key(run_dir: str) -> tuple:
    """What a run is drawn from: its files (size, mtime) and, while it has no summary, its status (a run that dies
    or goes quiet changes that even when no file does)."""
    d = Path(run_dir)
    sig = signature(d, RUN_FILES)
    if not (d / "config.json").is_file() or (d / "summary.json").exists():
        return sig, None
    return sig, status_of(d, orjson.loads((d / "config.json").read_bytes()), False)


@app.function
def accuracy_points(run: dict, kind: str = "held-out") -> tuple[list, list, list, list]:
    """Held-out (or, `kind` "retention", retention-task) accuracy by policy step (the base model at step 0), with
    each point's 95% Wilson interval."""
    base, base_n, col, n_col = (("base_accuracy", "eval_n", "accuracy", "n") if kind == "held-out" else
                                ("base_retention", "retention_n", "retention_accuracy", "retention_n"))
    xs, ys, lo, hi = [], [], [], []
    points = ([(0.0, run[base], run[base_n])] if run.get(base) is not None else []) + [
        (r["trainer_step"], r[col], r[n_col]) for r in run["candidates"].iter_rows(named=True)
        if r.get(col) is not None]
    for x, y, n in points:
        a, b = wilson(y * n, n)
        xs.append(x), ys.append(y), lo.append(y - a), hi.append(b - y)
    return xs, ys, lo, hi


@app.function
def plot_run(run: dict):
    """Six panels, each against the trainer's policy step (critic warm-up batches sit at step 0), with a dashed
    line where a release went live; 1080 x 560 px."""
    fig, axes = figure(1080, 560, 2, 3)
    steps = run["steps"]
    released = [s for s in run["releases"]["trainer_step"].to_list() if s is not None]
    for ax, (col, title) in zip(axes.flat, PANELS, strict=True):
        if col == "accuracy":  # the trained task's held-out accuracy, and beside it what the release kept of another
            top, seen = [0.2], []
            for kind, marker in (("held-out", "o"), ("retention", "s")):
                xs, ys, lo, hi = accuracy_points(run, kind)
                if xs:
                    bars = ax.errorbar(xs, ys, yerr=[lo, hi], marker=marker, capsize=4, label=kind)
                    bars.lines[2][0].set_gid("accuracy-ci" if kind == "held-out" else "retention-ci")
                    top += [y + h for y, h in zip(ys, hi, strict=True)]
                    seen += xs
            if len(ax.get_legend_handles_labels()[0]) > 1:
                ax.legend(loc="lower right")
            fit_axes(ax, seen + released, None)
            ax.set_ylim(-0.02, max(top) * 1.05)
        else:
            data = steps.filter(pl.col(col).is_not_null())
            xs, ys = data["trainer_step"].to_list(), data[col].to_list()
            ax.plot(xs, ys, marker=".", linestyle="-")
            fit_axes(ax, xs + released, ys)
            if not xs:  # e.g. a value model's error in a run of a recipe that has none
                ax.text(0.5, 0.5, f"not measured by {run['config'].get('recipe', 'this recipe')}",
                        transform=ax.transAxes, ha="center", va="center", color="grey")
                ax.set_yticks([])
        for step in released:
            ax.axvline(step, color="grey", linestyle="--", alpha=0.5)
        ax.set_title(title)
        ax.set_xlabel(STEP)
    return fig


@app.function
def report_title(col: str) -> str:
    return REPORT_PANELS.get(col, f"reports: {col.removeprefix('report_')} (batch mean)")


@app.function
def plot_reports(run: dict):
    """What the reports say, per policy step: each `report_<key>` a step's row averages over its batch (a tool
    task's tool-call validity and task success, reef_lab.tasks.tools), one panel each; None when the reports
    carry no numbers."""
    return plot_step_panels(run, run["reported"], report_title, "sao")


@app.function
def plot_distill(run: dict):
    """A distillation run's own numbers per policy step: the divergence it trains on, the teacher-student log-prob
    gap on the generated tokens (it shrinks as the student takes the teacher's choices), and for context
    distillation the prompt tokens the release saves; None for a run of another recipe."""
    return plot_step_panels(run, run.get("distilled") or [], DISTILL_PANELS.get, "distill")


@app.function
def plot_step_panels(run: dict, cols: list[str], title, gid: str):
    """One panel per step-row column, against the policy step, dashed where a release went live; None for none."""
    if not cols:
        return None
    ncols = min(3, len(cols))
    fig, axes = figure(360 * ncols, 280 * -(-len(cols) // ncols), -(-len(cols) // ncols), ncols)
    released = [s for s in run["releases"]["trainer_step"].to_list() if s is not None]
    for ax, col in zip(axes.flat, cols):
        data = run["steps"].filter(pl.col(col).is_not_null())
        xs, ys = data["trainer_step"].to_list(), data[col].to_list()
        ax.plot(xs, ys, marker="o", linestyle="-", gid=f"{gid}-{col}")
        fit_axes(ax, xs + released, ys)
        for step in released:
            ax.axvline(step, color="grey", linestyle="--", alpha=0.5)
        ax.set_title(title(col))
        ax.set_xlabel(STEP)
    for ax in list(axes.flat)[len(cols):]:
        ax.set_visible(False)
    return fig


@app.function
def by_step(run: dict, col: str) -> dict[float, float]:
    """A metric by policy step: held-out accuracy per candidate (base at 0), else the mean over that step's batches."""
    if col == "accuracy":
        xs, ys, _, _ = accuracy_points(run)
        return dict(zip(xs, ys, strict=True))
    data = run["steps"].filter(pl.col(col).is_not_null()).group_by("trainer_step").agg(pl.col(col).mean())
    return dict(data.sort("trainer_step").iter_rows())


@app.function
def plot_compare(runs: list[dict]):
    """Held-out accuracy, batch reward and policy loss of several runs against the policy step: each run thin,
    each group's mean bold with its 95% confidence band (Student t over the group's runs at that step)."""
    fig, axes = figure(1080, 330, 1, 3)
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(config_group(r["config"]), []).append(r)
    names = [g.rsplit("-", 1)[0] for g in groups]
    drawn: dict = {ax: [] for ax in axes.flat}  # every value drawn on each panel, for its axes
    for k, (key, members) in enumerate(groups.items()):
        colour = f"C{k}"
        name = key if names.count(names[k]) > 1 else names[k]
        for ax, col, title in zip(axes.flat, ("accuracy", "reward_mean", "loss"),
                                  ("held-out accuracy", "batch reward", "policy loss"), strict=True):
            series = [by_step(r, col) for r in members]
            for s in series:
                ax.plot(list(s), list(s.values()), color=colour, alpha=0.35, linewidth=1)
                drawn[ax].append((list(s), list(s.values())))
            xs = sorted(set().union(*series))
            stats = [mean_ci([s[x] for s in series if x in s]) for x in xs]
            means = [m for m, _ in stats]
            line, = ax.plot(xs, means, color=colour, linewidth=2.5, marker="o" if len(xs) == 1 else None,
                            label=f"{name} (n={len(members)}): mean ± 95% CI")
            line.set_gid(f"mean-{key}")
            if len(members) > 1:
                band = ax.fill_between(xs, [m - h for m, h in stats], [m + h for m, h in stats], color=colour,
                                       alpha=0.18, linewidth=0)
                band.set_gid(f"band-{key}")
                drawn[ax] += [(xs, [m - h for m, h in stats]), (xs, [m + h for m, h in stats])]
            drawn[ax].append((xs, means))
            ax.set_title(title)
            ax.set_xlabel(STEP)
    for ax, lines in drawn.items():
        fit_axes(ax, [x for xs, _ in lines for x in xs], [y for _, ys in lines for y in ys])
    axes.flat[0].legend(loc="upper left")
    return fig


@app.function
def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):  # an empty one adds no field
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@app.function
def config_diff(runs: list[dict]) -> pl.DataFrame:
    """The config fields (dotted) whose values differ between the runs: one row per field, a column per run."""
    flat = [flatten(r["config"]) for r in runs]
    fields = sorted(set().union(*flat) - {"out_dir"})
    names = [Path(r["dir"]).name for r in runs]
    rows = [{"field": f, **{n: "" if f not in c else str(c[f]) for n, c in zip(names, flat, strict=True)}}
            for f in fields if len({orjson.dumps(c.get(f), option=orjson.OPT_SORT_KEYS) for c in flat}) > 1]
    return pl.DataFrame(rows, schema={"field": pl.String, **{n: pl.String for n in names}})


@app.function
def runs_frame(runs: list[dict]) -> pl.DataFrame:
    """One row per run: status, progress and outcome."""
    def acc(v):
        return None if v is None else round(v, 3)

    return pl.DataFrame([{
        "name": Path(r["dir"]).name, "recipe": r["config"]["recipe"], "seed": r["config"]["seed"],
        "status": r["status"], "progress": f"{r['rollouts_done']} of {r['rollouts_total']}",
        "base": acc(r["base_accuracy"]), "final": acc((r["summary"] or {}).get("final_accuracy")),
        "releases": len(r["index"]["releases"]),
        "minutes": None if not r["summary"] else round(r["summary"]["wall_s"] / 60, 1),
        "folder": r["dir"]} for r in runs],
        schema={"name": pl.String, "recipe": pl.String, "seed": pl.Int64, "status": pl.String,
                "progress": pl.String, "base": pl.Float64, "final": pl.Float64, "releases": pl.Int64,
                "minutes": pl.Float64, "folder": pl.String})


@app.function
def releases_html(run: dict) -> str:
    """Each release: version, step, held-out accuracy with its interval, when, and its Hub revision."""
    if not run["index"]["releases"]:
        return "<p><i>No release yet.</i></p>"
    rows = []
    for rel in run["index"]["releases"]:
        ev = rel.get("eval") or {}
        acc = ev.get("accuracy")
        n = ev.get("n") or run["eval_n"]
        ci = "" if acc is None else "[{:.3f}, {:.3f}]".format(*wilson(acc * n, n))
        rows.append(f"<tr><td>{html.escape(rel['version'])}</td><td>{html.escape(str(rel.get('parent')))}</td>"
                    f"<td>{rel.get('trainer_step')}</td><td>{'' if acc is None else f'{acc:.3f}'}</td><td>{ci}</td>"
                    f"<td>{utc(rel.get('created_at'))}</td><td>{hub_cell(rel)}</td></tr>")
    head = "".join(f"<th style='text-align:left; padding-right:1.5em'>{h}</th>" for h in
                   ("release", "parent", "policy step", "held-out", "95% CI", "released (UTC)", "Hub revision"))
    return f"<table id='sao-releases'><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


@app.function
def answers_by_candidate_html(run: dict) -> str:
    """Each evaluation's sample held-out answers next to its score: the base model, then every candidate (and the
    release it became), newest first; from the release index (the first 8 items of each evaluation)."""
    index = run["index"]
    version = {r["candidate"]: r["version"] for r in index["releases"]}
    blocks = []
    for c in reversed(index["candidates"]):
        ev = c.get("eval") or {}
        acc = "" if ev.get("accuracy") is None else f": held-out accuracy <b>{ev['accuracy']:.3f}</b> of {ev.get('n')}"
        rel = f" → release <b>{html.escape(version[c['id']])}</b>" if c["id"] in version else ""
        blocks.append(answers_html(f"candidate {html.escape(c['id'])} (policy step {c.get('trainer_step')}, "
                                   f"{html.escape(str(c.get('status')))}){rel}{acc}", eval_answers(ev)))
    base = index.get("base_eval")
    if base:
        blocks.append(answers_html(f"base model: held-out accuracy <b>{base['accuracy']:.3f}</b> of {base.get('n')}",
                                   eval_answers(base)))
    return f"<div id='sao-answers'>{''.join(blocks)}</div>" if blocks else "<p><i>No evaluation yet.</i></p>"


@app.cell
def _():
    mo.md("# Weight experiments (SFT, SAO, GRPO, distillation)")
    return


@app.cell
def _():
    example_ui = mo.ui.dropdown(EXAMPLES, value=EXAMPLES[0], label="example")
    return (example_ui,)


@app.cell
def _(example_ui):
    example = yaml.safe_load((ROOT / example_ui.value).read_text())
    seed_ui = mo.ui.number(0, 10**6, value=int(example.get("seed", 0)), label="seed")
    rollouts_ui = mo.ui.number(1, 10**7, value=int(example["rollouts"]), label="rollouts")
    lr_ui = mo.ui.text(value=f"{example['recipe_config']['trainer']['lr']:g}", label="learning rate")
    out_ui = mo.ui.text(value="runs/app", label="runs folder")
    launch_ui = mo.ui.run_button(label="launch")
    return example, launch_ui, lr_ui, out_ui, rollouts_ui, seed_ui


@app.cell
def _(example, example_ui, lr_ui, out_ui, rollouts_ui, seed_ui):
    # Only fields changed from the example become overrides: unchanged, the launch is the example's own command.
    launch_error = None
    overrides = {}
    try:
        _lr = float(lr_ui.value)
        if _lr != float(example["recipe_config"]["trainer"]["lr"]):
            overrides["recipe_config.trainer.lr"] = _lr
    except ValueError:
        launch_error = f"learning rate {lr_ui.value!r} is not a number"
    if int(rollouts_ui.value) != int(example["rollouts"]):
        overrides["rollouts"] = int(rollouts_ui.value)
    _out = Path(out_ui.value).expanduser()
    launch_dir = (_out if _out.is_absolute() else ROOT / _out) / f"{example['name']}-seed{int(seed_ui.value)}"
    launch_cmd = (f"python scripts/run_experiment.py {example_ui.value} --seed {int(seed_ui.value)} "
                  f"--out {shown(launch_dir)}"
                  + "".join(f" --set {k}={yaml_value(v)}" for k, v in overrides.items()))
    return launch_cmd, launch_dir, launch_error, overrides


@app.cell
def _(example_ui, launch_cmd, launch_error, launch_ui, lr_ui, out_ui, rollouts_ui, seed_ui):
    mo.vstack([mo.md("## Launch a run"),
               mo.hstack([example_ui, seed_ui, rollouts_ui, lr_ui, out_ui, launch_ui], justify="start", gap=1.5),
               mo.callout(mo.md(launch_error), kind="danger") if launch_error else mo.md(f"`{launch_cmd}`")])
    return


@app.cell
def _():
    get_run, set_run = mo.state(None)  # the run shown in detail (None: the first offered)
    get_picked, set_picked = mo.state(None)  # the runs ticked for comparison (None: the run shown in detail)
    return get_picked, get_run, set_picked, set_run


@app.cell
def _(example_ui, launch_dir, launch_error, launch_ui, overrides, seed_ui, set_run):
    launched = None
    if launch_ui.value and not launch_error:
        _proc = launch_detached(ROOT / example_ui.value, int(seed_ui.value), launch_dir, overrides, root=ROOT)
        launched = str(launch_dir)
        set_run(launched)
        mo.output.replace(mo.md(f"Started pid {_proc.pid}, writing `{launch_dir}` (log: `{launch_dir}/run.log`)."))
    return (launched,)


@app.cell
def _():
    _default = os.environ.get("REEF_LAB_RUNS") or "runs"
    root_ui = mo.ui.text(value=_default, label="look for runs under", full_width=True)
    # Shown by the cell that makes it: a cell showing it elsewhere would re-run on every tick.
    refresh_ui = mo.ui.refresh(options=["5s", "10s", "30s", "1m"], default_interval="10s", label="auto-refresh")
    mo.vstack([mo.md("## Runs"), mo.hstack([root_ui, refresh_ui], widths=[6, 1], align="end")])
    return refresh_ui, root_ui


@app.cell
def _(launched, root_ui):
    _root = Path(root_ui.value).expanduser()
    runs_root = _root if _root.is_absolute() else ROOT / _root

    def dirs_now() -> list[str]:
        """The runs offered: $REEF_LAB_RUN, the run launched here, then those under the runs folder."""
        return run_choices(find_runs(runs_root), launched)

    def files_now(dirs: list[str]) -> tuple:
        return tuple(watch_key(d) for d in dirs)

    # What each part of the page was drawn from: a refresh tick redraws a part only when its own files changed.
    get_dirs, set_dirs = mo.state(dirs_now())
    get_files, set_files = mo.state(files_now(get_dirs()))
    return dirs_now, files_now, get_dirs, get_files, set_dirs, set_files


@app.cell
def _(get_dirs, get_files):
    get_files()
    all_runs = {d: _r for d in get_dirs() if (_r := load_run(d)) is not None}
    return (all_runs,)


@app.cell
def _(all_runs, get_picked, set_picked):
    runs_table_data = runs_frame(list(all_runs.values()))
    _picked = get_picked()
    if _picked is None:
        _picked = list(all_runs)[:1]
    runs_table = mo.ui.table(
        runs_table_data, selection="multi", page_size=10, show_column_summaries=False, show_data_types=False,
        initial_selection=[k for k, d in enumerate(all_runs) if d in _picked], label="tick runs to compare",
        on_change=lambda df: set_picked(df["folder"].to_list()))
    return (runs_table,)


@app.cell
def _(all_runs, runs_table):
    runs_table if all_runs else mo.md("_No run folder yet: launch one above or run scripts/run_experiment.py._")
    return


@app.cell
def _(get_dirs, get_picked):
    _picked = get_picked()
    picked_dirs = [d for d in (_picked if _picked is not None else get_dirs()[:1]) if d in get_dirs()]
    get_compared, set_compared = mo.state(tuple(watch_key(d) for d in picked_dirs))
    return get_compared, picked_dirs, set_compared


@app.cell
def _(get_compared, picked_dirs):
    get_compared()
    compared = [_r for d in picked_dirs if (_r := load_run(d)) is not None]
    if len(compared) < 2:
        _out = mo.md("## Compare runs\n_Tick two or more runs in the table to overlay them._")
    else:
        _diff = config_diff(compared)
        _status = mo.md("  \n".join(f"`{Path(r['dir']).name}`: {r['status']}, "
                                    f"{r['rollouts_done']} of {r['rollouts_total']} rollouts" for r in compared))
        _out = mo.vstack([
            mo.md(f"## Compare runs ({len(compared)})"), svg(plot_compare(compared), "sao-compare-figure"),
            mo.md("Thin lines: each run. Bold: each group's mean (a group: runs whose configs differ only in seed), "
                  "band: its 95% confidence interval over the group's runs."), _status,
            mo.md("### How the configs differ"),
            mo.ui.table(_diff, selection=None, show_column_summaries=False, show_data_types=False, page_size=50)
            if _diff.height else mo.md("_The configs are the same._")])
    _out
    return (compared,)


@app.cell
def _(get_dirs, get_run, set_run):
    _dirs = get_dirs()
    run_ui = mo.ui.dropdown(_dirs, value=get_run() if get_run() in _dirs else (_dirs[0] if _dirs else None),
                            label="run folder", on_change=set_run)
    return (run_ui,)


@app.cell
def _(run_ui):
    get_shown, set_shown = mo.state(watch_key(run_ui.value) if run_ui.value else None)
    return get_shown, set_shown


@app.cell
def _(dirs_now, files_now, get_compared, get_dirs, get_files, get_shown, picked_dirs, refresh_ui, run_ui,
      set_compared, set_dirs, set_files, set_shown):
    # Every tick: compare each part's files with what it was drawn from; only a changed part is re-read and redrawn
    # (a finished run's never is).
    refresh_ui.value
    _dirs = dirs_now()
    if _dirs != get_dirs():
        set_dirs(_dirs)
    _files = files_now(_dirs)
    if _files != get_files():
        set_files(_files)
    _compared = tuple(watch_key(d) for d in picked_dirs)
    if _compared != get_compared():
        set_compared(_compared)
    _shown = watch_key(run_ui.value) if run_ui.value else None
    if _shown != get_shown():
        set_shown(_shown)
    return


@app.cell
def _(get_shown, run_ui):
    get_shown()
    run = load_run(run_ui.value) if run_ui.value else None
    if run is None:
        _out = mo.md("_No run in this folder yet (a launch writes its config first)._")
    else:
        _s, _c = run["summary"], run["config"]
        _head = (f"**{_c['name']}** ({_c['recipe']}, seed {_c['seed']}): **{run['status']}**, "
                 + progress_html(run["rollouts_done"], run["rollouts_total"], "rollouts")
                 + f"; {run['steps'].height} training batches, {run['candidates'].height} candidates, "
                 f"{run['releases'].height} releases; base held-out accuracy {run['base_accuracy']}")
        if _s:
            _head += (f"; final {_s['final_accuracy']} after {_s['rollouts']} rollouts "
                      f"({_s['wall_s'] / 60:.1f} min)")
        _links = [f"Folder `{run['dir']}`" + (f", log `{run['dir']}/run.log`" if Path(run["dir"], "run.log").exists()
                                               else ""), wandb_md(run["wandb"])]
        _cands = run["candidates"].with_columns(
            ci_low=pl.struct("accuracy", "n").map_elements(lambda r: wilson(r["accuracy"] * r["n"], r["n"])[0]
                                                           if r["accuracy"] is not None else None, pl.Float64),
            ci_high=pl.struct("accuracy", "n").map_elements(lambda r: wilson(r["accuracy"] * r["n"], r["n"])[1]
                                                            if r["accuracy"] is not None else None, pl.Float64))
        _out = mo.vstack(
            [mo.md(_head), mo.md("  \n".join(_links)), svg(plot_run(run), "sao-run-figure"),
             mo.md("Held-out accuracy: base model at step 0, then each candidate; bars: 95% Wilson intervals over "
                   f"the {run['eval_n']} held-out items. Dashed lines: releases." if accuracy_points(run)[0] else
                   "No held-out evaluation in this run (its recipe config names no `eval_task`; a client may score "
                   "releases itself, as scripts/studies/learn_tool_task.py does). Dashed lines: releases."),
             *([mo.md("### What the reports say, per step (mean over each training batch)"),
                svg(plot_reports(run), "sao-reports-figure")] if run["reported"] else []),
             *([mo.md("### Distillation, per step: the divergence trained on and the teacher-student gap"),
                svg(plot_distill(run), "sao-distill-figure")] if run["distilled"] else []),
             mo.md("### Releases"), mo.Html(releases_html(run)),
             mo.md("### Candidates"),
             mo.ui.table(tidy(_cands), selection=None, show_column_summaries=False, show_data_types=False),
             mo.md("### Sample answers: each candidate's held-out answers next to its score (click to open)"),
             mo.Html(answers_by_candidate_html(run)),
             mo.md("### Steps"),
             mo.ui.table(tidy(run["steps"]), selection=None, show_column_summaries=False, show_data_types=False)]
            + ([mo.md(f"### Errors\n{run['errors']}")] if run["errors"] else []))
    mo.vstack([mo.md("## One run"), run_ui, _out])
    return (run,)


if __name__ == "__main__":
    app.run()
