"""Run and inspect GEPA harness searches: launch an experiment, or open one (or a live scenario's search).

    marimo edit apps/gepa.py
    REEF_LAB_RUN=runs/gepa-arithmetic-seed0 marimo export html apps/gepa.py -o out.html   # headless

A search folder holds `events.jsonl` (reef_lab/gepa_search.py): an experiment's run folder
(scripts/run_experiment.py recipes/gepa/examples/*.yaml) or a live scenario's `data/learn/<scenario>/gepa`. The app
shows the candidate tree (each candidate's parent, the component its mutation rewrote, its validation mean), one
candidate's text with the diff to its parent and its per-example scores, the Pareto front after each new candidate,
and validation score against metric calls (each new candidate and the best so far).
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab GEPA")

with app.setup:
    import difflib
    import json
    from pathlib import Path

    import marimo as mo
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import polars as pl

    import sys

    ROOT = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(ROOT))  # recipes/ ships in the repository, not in the installed package

    from reef_lab.learning.experiment import launch_detached, run_choices
    from recipes.gepa.search import read_events


@app.function
def find_searches(root: Path) -> list[str]:
    """Folders holding a GEPA events.jsonl under `root`, newest first."""
    if not root.exists():
        return []
    found = [p.parent for p in root.rglob("events.jsonl")]
    return [str(p) for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


@app.function
def load_search(folder: str | Path) -> dict:
    """A search's candidates, iterations, fronts and releases (polars frames) plus its config and summary."""
    folder = Path(folder)
    events = read_events(folder)
    cands = [e for e in events if e["event"] == "candidate"]
    candidates = pl.DataFrame([{"id": e["id"], "origin": e["origin"], "parents": ",".join(map(str, e["parents"])),
                                "changed": e.get("changed") or "", "val_mean": e["mean"],
                                "parent_mean": e.get("parent_mean"), "metric_calls": e["metric_calls"]}
                               for e in cands], schema={"id": pl.Int64, "origin": pl.String, "parents": pl.String,
                                                        "changed": pl.String, "val_mean": pl.Float64,
                                                        "parent_mean": pl.Float64, "metric_calls": pl.Int64})
    iterations = pl.DataFrame([{"iteration": e["iteration"], "kind": e["kind"], "outcome": e["outcome"],
                                "parent": str(e.get("parent", e.get("parents", ""))),
                                "component": e.get("component") or "", "parent_sum": sum(e.get("parent_scores") or
                                                                                       e.get("parent_sums") or []),
                                "child_sum": sum(e.get("child_scores") or []), "metric_calls": e["metric_calls"]}
                               for e in events if e["event"] == "iteration"],
                              schema={"iteration": pl.Int64, "kind": pl.String, "outcome": pl.String,
                                      "parent": pl.String, "component": pl.String, "parent_sum": pl.Float64,
                                      "child_sum": pl.Float64, "metric_calls": pl.Int64})
    fronts = [{"after_candidate": c["id"], "metric_calls": f["metric_calls"], "front": f["front"],
               "best": f["best"], "best_mean": f["best_mean"]}
              for c, f in zip(cands, [e for e in events if e["event"] == "front"], strict=False)]
    config, summary = None, None
    for name in ("config.json", "summary.json"):
        if (folder / name).exists():
            data = json.loads((folder / name).read_text())
            config, summary = (data, summary) if name == "config.json" else (config, data)
    return {"dir": str(folder), "events": events, "cands": {e["id"]: e for e in cands}, "candidates": candidates,
            "iterations": iterations, "fronts": fronts, "releases": [e for e in events if e["event"] == "release"],
            "config": config, "summary": summary}


@app.function
def diff_to_parent(search: dict, cid: int) -> str:
    """Unified diff of each component against the candidate's first parent ('' for the seed)."""
    cand = search["cands"][cid]
    if not cand["parents"]:
        return ""
    parent = search["cands"][cand["parents"][0]]
    out = []
    for name in sorted(set(cand["components"]) | set(parent["components"])):
        a, b = parent["components"].get(name, ""), cand["components"].get(name, "")
        if a != b:
            out += difflib.unified_diff(a.splitlines(), b.splitlines(), f"c{parent['id']}/{name}",
                                        f"c{cid}/{name}", lineterm="")
    return "\n".join(out)


@app.function
def tree_mermaid(search: dict) -> str:
    """The candidate tree as a mermaid graph: edges from parents, labels with the rewritten component and score."""
    lines = ["graph TD"]
    best = max(search["cands"].values(), key=lambda c: (c["mean"], -c["id"]))["id"] if search["cands"] else None
    for c in search["cands"].values():
        label = f"c{c['id']}: {c['mean']:.3f}" + (f"<br/>{c['changed']}" if c.get("changed") else
                                                  "<br/>merge" if len(c["parents"]) > 1 else "<br/>seed")
        lines.append(f'  c{c["id"]}["{label}"]')
        lines += [f"  c{p} --> c{c['id']}" for p in c["parents"]]
    if best is not None:
        lines.append(f"  style c{best} stroke-width:3px")
    return "\n".join(lines)


@app.function
def plot_search(search: dict):
    """Validation score against metric calls, and the Pareto front after each new candidate."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.4))
    c = search["candidates"]
    if c.height:
        ax1.scatter(c["metric_calls"].to_list(), c["val_mean"].to_list(), label="new candidate", zorder=3)
        best, xs, ys = 0.0, [], []
        for x, y in zip(c["metric_calls"].to_list(), c["val_mean"].to_list(), strict=True):
            best = max(best, y)
            xs.append(x)
            ys.append(best)
        last = search["iterations"]["metric_calls"].max() if search["iterations"].height else xs[-1]
        ax1.step(xs + [max(last or 0, xs[-1])], ys + [ys[-1]], where="post", label="best so far")
    for r in search["releases"]:
        ax1.axvline(r["metric_calls"], color="grey", linestyle="--", alpha=0.5)
    ax1.set_xlabel("metric calls")
    ax1.set_ylabel("validation mean")
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)
    for k, f in enumerate(search["fronts"]):
        ids = [int(i) for i in f["front"]]
        ax2.scatter([k] * len(ids), ids, s=[20 + 15 * f["front"][str(i)] for i in ids], color="C1")
    ax2.set_xlabel("pool update (new candidate)")
    ax2.set_ylabel("candidate on the Pareto front")
    ax2.set_title("Pareto front (size ~ examples where best)", fontsize=10)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return fig


@app.cell
def _():
    mo.md("# GEPA harness searches")
    return


@app.cell
def _():
    _examples = sorted(p.name for p in (ROOT / "recipes/gepa/examples").glob("*.yaml") if p.stem != "live")
    example_ui = mo.ui.dropdown(_examples, value="copycolors.yaml" if "copycolors.yaml" in _examples else _examples[0],
                                label="example")
    seed_ui = mo.ui.number(0, 1000, value=0, label="seed")
    budget_ui = mo.ui.number(10, 100_000, step=10, value=200, label="metric calls")
    out_ui = mo.ui.text(value="runs/app-gepa", label="runs folder")
    launch_ui = mo.ui.run_button(label="launch")
    mo.vstack([mo.md("## Launch a run (recipes/gepa/examples)"),
               mo.hstack([example_ui, seed_ui, budget_ui, out_ui, launch_ui])])
    return budget_ui, example_ui, launch_ui, out_ui, seed_ui


@app.cell
def _(budget_ui, example_ui, launch_ui, out_ui, seed_ui):
    launched = None
    if launch_ui.value:
        _dir = Path(out_ui.value) / f"{Path(example_ui.value).stem}-seed{int(seed_ui.value)}"
        _proc = launch_detached(ROOT / "recipes/gepa/examples" / example_ui.value, int(seed_ui.value), _dir,
                                {"search.max_metric_calls": int(budget_ui.value)}, root=ROOT)
        launched = str(_dir)
        mo.output.replace(mo.md(f"Started pid {_proc.pid}, writing `{_dir}` (log: `{_dir}/run.log`)."))
    return (launched,)


@app.cell
def _(launched):
    _options = run_choices(find_searches(ROOT / "runs") + find_searches(ROOT / ".reef_lab" / "learn"), launched)
    run_ui = mo.ui.dropdown(_options, value=_options[0] if _options else None, label="search folder")
    refresh_ui = mo.ui.refresh(default_interval="10s", label="refresh")
    mo.vstack([mo.md("## Open a search"), mo.hstack([run_ui, refresh_ui])])
    return refresh_ui, run_ui


@app.cell
def _(refresh_ui, run_ui):
    refresh_ui.value
    search = load_search(run_ui.value) if run_ui.value else None
    if search is None or not search["cands"]:
        _out = mo.md("_No search yet: launch one above, or run scripts/run_experiment.py with a gepa example._")
    else:
        _s = search["summary"]
        _calls = search["events"][-1]["metric_calls"]
        _head = (f"**{search['dir']}**: {len(search['cands'])} candidates, {search['iterations'].height} iterations, "
                 f"{_calls} metric calls, {len(search['releases'])} releases")
        if _s:
            _head += (f"; test: seed harness {_s['seed_test']:.3f} → best {_s['best_test']:.3f} "
                      f"({_s['test_size']} items)")
        _out = mo.vstack([mo.md(_head), plot_search(search), mo.md("### Candidate tree"),
                          mo.mermaid(tree_mermaid(search)),
                          mo.md("### Candidates"), mo.ui.table(search["candidates"].to_dicts(), selection=None)])
    _out
    return (search,)


@app.cell
def _(search):
    cand_ui = None
    if search is not None and search["cands"]:
        _ids = [str(i) for i in sorted(search["cands"])]
        cand_ui = mo.ui.dropdown(_ids, value=_ids[-1], label="candidate")
    cand_ui
    return (cand_ui,)


@app.cell
def _(cand_ui, search):
    _out = None
    if cand_ui is not None and cand_ui.value is not None:
        _c = search["cands"][int(cand_ui.value)]
        _files = "\n\n".join(f"**{k}**\n```\n{v}\n```" for k, v in sorted(_c["components"].items()))
        _diff = diff_to_parent(search, _c["id"])
        _out = mo.vstack([
            mo.md(f"### Candidate {_c['id']} ({_c['origin']}; parents {_c['parents'] or '-'}; rewrote "
                  f"{_c.get('changed') or '-'}): validation mean {_c['mean']:.3f}"),
            mo.md(_files), mo.md("**Diff to its parent**\n```diff\n" + (_diff or "(seed)") + "\n```"),
            mo.md(f"**Per-example validation scores** {_c['scores']}"),
            mo.md("### Iterations"), mo.ui.table(search["iterations"].to_dicts(), selection=None)])
    _out
    return


if __name__ == "__main__":
    app.run()
