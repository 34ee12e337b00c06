"""Run and inspect GEPA harness searches: launch an experiment, or open one (or a live scenario's search).

    marimo run apps/gepa.py                 # as an app (marimo edit: as a notebook)
    REEF_LAB_RUN=runs/gepa-arithmetic-seed0 marimo export html apps/gepa.py -o out.html   # headless

A search folder holds `events.jsonl` (recipes/gepa/search.py): an experiment's run folder
(scripts/run_experiment.py recipes/gepa/examples/*.yaml, with `summary.json`, `test_answers.jsonl`, its releases
under `data/releases` and its W&B run under `wandb`) or a live scenario's `data/learn/<scenario>/gepa`. Searches
under runs/ and .reef_lab/learn are offered; "open a path" opens any other (a search folder, or a folder holding
some) without a restart. The app shows the search's status (its heartbeat: running, finished, failed, stopped) and
progress (metric calls of the budget), validation score against metric calls, the candidate tree, one candidate's
files (wrapped) with a coloured diff to its parent and its answers on the validation items with their scores, every
validation item's score under every candidate (each item's Pareto front marked as the search computes it), the
saved test answers of the seed and the best harness, and links to the W&B run folder and each release's Hub
revision. The launch form starts from the example's values
(only changed fields become overrides). Auto-refresh re-reads only when the search's files changed and keeps the
picked candidate.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab GEPA")

with app.setup:
    import difflib
    import html
    import json
    import os
    from pathlib import Path

    import marimo as mo
    import polars as pl
    import yaml

    ROOT = Path(__file__).resolve().parents[1]

    from apps.shared import (answers_html, figure, fit_axes, hub_cell, progress_html, run_status, shown, signature,
                             svg, tidy, utc, wandb_md, wandb_runs)
    from recipes.gepa.pareto import item_fronts, pareto_counts
    from recipes.gepa.search import harness_hash, read_events
    from apps.launch import launch_detached, run_choices, yaml_value

    SEARCH_FILES = ("events.jsonl", "state.json", "summary.json", "test_answers.jsonl", "config.json", "index.json",
                    "run.log", "run.pid")
    PRE = "white-space: pre-wrap; overflow-wrap: anywhere; margin: 0.3em 0 0.8em; font-size: 0.85em"
    DIFF_STYLE = {"+": "background: #e6ffec; color: #1a7f37", "-": "background: #ffebe9; color: #cf222e",
                  "@": "background: #ddf4ff; color: #0550ae"}


@app.function
def find_searches(root: Path) -> list[str]:
    """Folders holding a GEPA events.jsonl under `root`, newest first."""
    if not root.exists():
        return []
    found = [p.parent for p in root.rglob("events.jsonl")]
    return [str(p) for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


@app.function
def release_index(folder: Path, config: dict | None) -> dict:
    """The release index of the search's scenario: an experiment's `data/releases/<name>`, or for a live search
    (`<data>/learn/<scenario>/gepa`) `<data>/releases/<scenario>`."""
    if config is not None:
        path = folder / "data" / "releases" / config["name"] / "index.json"
    elif folder.name == "gepa" and folder.parent.parent.name == "learn":
        path = folder.parents[2] / "releases" / folder.parent.name / "index.json"
    else:
        return {"releases": []}
    return json.loads(path.read_text()) if path.exists() else {"releases": []}


@app.function
def load_search(folder: str | Path) -> dict:
    """A search's candidates, iterations, fronts and releases (polars frames) plus its config, summary, test
    answers, release index, W&B folders, status and budget."""
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
    answers_file = folder / "test_answers.jsonl"
    answers = [json.loads(x) for x in answers_file.read_text().splitlines() if x.strip()] if answers_file.exists() \
        else []
    state_file = folder / "state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    live = config is None and folder.name == "gepa"
    status = ("finished" if summary else "live scenario" if live
              else run_status(folder, False, [folder / "events.jsonl"]))
    budget = (summary or {}).get("budget") or ((config or {}).get("search") or {}).get("max_metric_calls")
    return {"dir": str(folder), "events": events, "cands": {e["id"]: e for e in cands}, "candidates": candidates,
            "iterations": iterations, "fronts": fronts, "releases": [e for e in events if e["event"] == "release"],
            "config": config, "summary": summary, "test_answers": answers, "index": release_index(folder, config),
            "wandb": wandb_runs(folder, folder / "data"), "status": status, "budget": budget,
            "metric_calls": events[-1]["metric_calls"] if events else 0,
            "cache": state.get("cache") or [], "val_ids": state.get("val_ids") or []}


@app.function
def watch_key(folder: str) -> tuple:
    """What a search is drawn from: its files (size, mtime) and, while unfinished, its status."""
    d = Path(folder)
    sig = signature(d, SEARCH_FILES)
    if (d / "summary.json").exists() or not (d / "events.jsonl").exists():
        return sig, None
    return sig, run_status(d, False, [d / "events.jsonl"])


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
def diff_html(diff: str) -> str:
    """A unified diff as a wrapped <pre>: added lines green (.diff-add), removed red (.diff-del), hunks blue."""
    lines = []
    for line in diff.splitlines():
        kind = ("" if line.startswith(("+++", "---")) else "diff-add" if line.startswith("+")
                else "diff-del" if line.startswith("-") else "diff-hunk" if line.startswith("@@") else "")
        style = DIFF_STYLE.get(line[:1], "") if kind else "color: #57606a"
        lines.append(f"<span class='{kind}' style='display: block; {style}'>{html.escape(line) or ' '}</span>")
    return f"<pre class='gepa-diff' style='{PRE}'>{''.join(lines)}</pre>"


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
    """Validation score against metric calls, and the Pareto front after each new candidate; 1080 x 340 px."""
    fig, axes = figure(1080, 340, 1, 2)
    ax1, ax2 = axes.flat
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
        ax1.legend(loc="lower right")
    for r in search["releases"]:
        ax1.axvline(r["metric_calls"], color="grey", linestyle="--", alpha=0.5)
    fit_axes(ax1, c["metric_calls"].to_list() + [r["metric_calls"] for r in search["releases"]],
             c["val_mean"].to_list())
    ax1.set_xlabel("metric calls")
    ax1.set_ylabel("validation mean")
    ax1.set_title("validation score (dashed: releases)")
    xs, ys = [], []
    for k, f in enumerate(search["fronts"]):
        ids = [int(i) for i in f["front"]]
        ax2.scatter([k] * len(ids), ids, s=[30 + 20 * f["front"][str(i)] for i in ids], color="C1")
        xs += [k] * len(ids)
        ys += ids
    fit_axes(ax2, xs, ys, integer_y=True)  # y: candidate ids
    ax2.set_xlabel("pool update (new candidate)")
    ax2.set_ylabel("candidate on the front")
    ax2.set_title("Pareto front (size ~ parent-draw weight)")
    return fig


@app.function
def pareto_view(search: dict) -> dict:
    """What the Pareto table marks, as the search computes it (recipes/gepa/pareto.py, gepa 0.1.4's pruning): each
    item's front (empty where no candidate scores above 0: nobody wins an item nobody solves), the front candidates
    (those a parent is drawn from) with their draw weights, and how many items each is best on with a score > 0."""
    cands = sorted(search["cands"].values(), key=lambda c: c["id"])
    n = max((len(c["scores"]) for c in cands), default=0)
    pool = {c["id"]: c["scores"] for c in cands if len(c["scores"]) == n}  # a candidate not scored on all: unmarked
    fronts = item_fronts(pool)
    tops = [max(s[i] for s in pool.values()) for i in range(n)] if pool else []
    shown = [f if top > 0 else set() for f, top in zip(fronts, tops, strict=True)]
    return {"fronts": shown, "weights": pareto_counts(pool), "tops": tops,
            "best_on": {c["id"]: sum(c["id"] in f for f in shown) for c in cands}}


@app.function
def pareto_items_html(search: dict, picked: int | None) -> str:
    """Every validation item's score under every candidate: in bold on green the item's front (its best score > 0,
    dominated candidates pruned as the search prunes them); an item no candidate scores on in grey; the picked
    candidate's column outlined; the front candidates marked in the header; last rows: items each is best on, and its
    weight when the search draws a parent."""
    cands = sorted(search["cands"].values(), key=lambda c: c["id"])
    view = pareto_view(search)
    pad = "padding: 2px 10px; text-align: right"
    outline = "outline: 2px solid #0969da; "

    def head(c):
        front = "<br/><small class='gepa-front'>front</small>" if c["id"] in view["weights"] else ""
        return f"<th style='{pad}; {outline if c['id'] == picked else ''}'>c{c['id']}{front}</th>"

    rows = []
    for i in range(max((len(c["scores"]) for c in cands), default=0)):
        nobody = i < len(view["tops"]) and view["tops"][i] <= 0
        cells = []
        for c in cands:
            s = c["scores"][i] if i < len(c["scores"]) else None
            best = i < len(view["fronts"]) and c["id"] in view["fronts"][i]
            style = ("font-weight: 700; background: #dafbe1; " if best else "") + (
                outline if c["id"] == picked else "")
            cells.append(f"<td class='{'front' if best else ''}' style='{pad}; {style}'>"
                         f"{'' if s is None else format(s, 'g')}</td>")
        label = f"val-{i}" + (" <small>(no candidate scores)</small>" if nobody else "")
        rows.append(f"<tr class='{'nobody' if nobody else ''}' style='{'color: #8c959f' if nobody else ''}'>"
                    f"<td style='padding: 2px 10px'>{label}</td>{''.join(cells)}</tr>")
    foot = "".join(
        f"<tr><td style='padding: 2px 10px'><i>{name}</i></td>"
        + "".join(f"<td style='{pad}'>{counts.get(c['id'], 0)}</td>" for c in cands) + "</tr>"
        for name, counts in (("best on", view["best_on"]), ("parent-draw weight", view["weights"])))
    return (f"<table id='gepa-pareto-items' style='width: auto'><thead><tr>"
            f"<th style='text-align: left; padding: 2px 10px'>item</th>{''.join(head(c) for c in cands)}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody><tfoot>{foot}</tfoot></table>")


@app.function
def candidate_answers(search: dict, cid: int) -> tuple[list[dict], bool]:
    """A candidate's answers on the validation items, in the order of its scores, from the search's rollout cache
    (state.json); True when that order is known (a search from before `val_ids` was saved: every cached answer of
    the harness, validation and training items alike, by item id)."""
    cand = search["cands"][cid]
    key = harness_hash(cand["components"])
    mine = {r["example_id"]: r for h, r in search["cache"] if h == key}
    def row(label: str, r: dict) -> dict:
        return {"item": label, "question": r.get("question") or "", "answer": r.get("output"),
                "score": r.get("score"), "feedback": r.get("feedback")}
    if search["val_ids"]:
        return [row(f"val-{i} ({ex})", mine[ex]) for i, ex in enumerate(search["val_ids"]) if ex in mine], True
    return [row(ex, mine[ex]) for ex in sorted(mine)], False


@app.function
def test_answers_html(search: dict) -> str:
    """The saved test answers: for each test item, the seed harness's and the best harness's answer and score."""
    by_item: dict[str, dict] = {}
    for a in search["test_answers"]:
        by_item.setdefault(a["example"], {})[a["candidate"]] = a
    rows = []
    for item, got in by_item.items():
        q = next((a.get("question") for a in got.values() if a.get("question")), "")
        cells = "".join(
            f"<td style='{PRE}; padding: 2px 10px; max-width: 28em'>{html.escape(got[c]['output']) if c in got else ''}"
            f"</td><td style='text-align: right; padding: 2px 10px'>"
            f"{format(got[c]['score'], 'g') if c in got else ''}</td>" for c in ("seed", "best"))
        rows.append(f"<tr style='border-bottom: 1px solid #e5e7eb'>"
                    f"<td style='padding: 2px 10px'>{html.escape(item)}</td>"
                    f"<td style='{PRE}; padding: 2px 10px; max-width: 24em'>{html.escape(q or '')}</td>{cells}</tr>")
    head = "".join(f"<th style='text-align: left; padding: 2px 10px'>{h}</th>" for h in
                   ("item", "question", "seed harness answer", "score", "best harness answer", "score"))
    return (f"<div id='gepa-test-answers'><table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"
            "</table></div>")


@app.cell
def _():
    mo.md("# GEPA harness searches")
    return


@app.cell
def _():
    _examples = sorted(p.name for p in (ROOT / "recipes/gepa/examples").glob("*.yaml") if p.stem != "live")
    example_ui = mo.ui.dropdown(_examples, value="copycolors.yaml" if "copycolors.yaml" in _examples else _examples[0],
                                label="example")
    return (example_ui,)


@app.cell
def _(example_ui):
    example = yaml.safe_load((ROOT / "recipes/gepa/examples" / example_ui.value).read_text())
    _budget = (example.get("search") or {}).get("max_metric_calls", 200)
    seed_ui = mo.ui.number(0, 10**6, value=int(example.get("seed", 0)), label="seed")
    budget_ui = mo.ui.number(1, 10**7, value=int(_budget), label="metric calls")
    out_ui = mo.ui.text(value="runs/app-gepa", label="runs folder")
    launch_ui = mo.ui.run_button(label="launch")
    return budget_ui, example, launch_ui, out_ui, seed_ui


@app.cell
def _(budget_ui, example, example_ui, launch_ui, out_ui, seed_ui):
    # Only fields changed from the example become overrides: unchanged, the launch is the example's own command.
    overrides = {}
    if int(budget_ui.value) != (example.get("search") or {}).get("max_metric_calls", 200):
        overrides["search.max_metric_calls"] = int(budget_ui.value)
    _out = Path(out_ui.value).expanduser()
    launch_dir = (_out if _out.is_absolute() else ROOT / _out) / f"{example['name']}-seed{int(seed_ui.value)}"
    launch_cmd = (f"python scripts/run_experiment.py recipes/gepa/examples/{example_ui.value} "
                  f"--seed {int(seed_ui.value)} --out {shown(launch_dir)}"
                  + "".join(f" --set {k}={yaml_value(v)}" for k, v in overrides.items()))
    mo.vstack([mo.md("## Launch a run (recipes/gepa/examples)"),
               mo.hstack([example_ui, seed_ui, budget_ui, out_ui, launch_ui], justify="start", gap=1.5),
               mo.md(f"`{launch_cmd}`")])
    return launch_dir, overrides


@app.cell
def _():
    get_folder, set_folder = mo.state(None)  # the search shown (None: the first offered)
    get_cand, set_cand = mo.state(None)  # the candidate picked (None: the newest)
    return get_cand, get_folder, set_cand, set_folder


@app.cell
def _(example_ui, launch_dir, launch_ui, overrides, seed_ui, set_folder):
    launched = None
    if launch_ui.value:
        _proc = launch_detached(ROOT / "recipes/gepa/examples" / example_ui.value, int(seed_ui.value), launch_dir,
                                overrides, root=ROOT)
        launched = str(launch_dir)
        set_folder(launched)
        mo.output.replace(mo.md(f"Started pid {_proc.pid}, writing `{launch_dir}` (log: `{launch_dir}/run.log`)."))
    return (launched,)


@app.function
def typed_path(value: str) -> Path | None:
    """The path typed into "open a path": absolute, or relative to the repository; None when empty."""
    if not value.strip():
        return None
    p = Path(value.strip()).expanduser()
    return p if p.is_absolute() else ROOT / p


@app.cell
def _(set_folder):
    def _open(value: str) -> None:
        _p = typed_path(value)
        if _p is not None and (_p / "events.jsonl").is_file():
            set_folder(str(_p))  # a search folder: show it at once
    path_ui = mo.ui.text(value="", label="open a path (a search folder, or a folder to look for searches in)",
                         full_width=True, on_change=_open)
    return (path_ui,)


@app.cell
def _(launched, path_ui):
    _typed = typed_path(path_ui.value)

    def folders_now() -> list[str]:
        """The searches offered: $REEF_LAB_RUN, the one launched here, the typed path (a search, or the searches
        under it), then those under runs/ and .reef_lab/learn."""
        typed = ([] if _typed is None else [str(_typed)] if (_typed / "events.jsonl").is_file()
                 else find_searches(_typed))
        return run_choices(typed + find_searches(ROOT / "runs") + find_searches(ROOT / ".reef_lab" / "learn"),
                           launched)

    get_folders, set_folders = mo.state(folders_now())
    # Shown by the cell that makes it: a cell showing it elsewhere would re-run on every tick.
    refresh_ui = mo.ui.refresh(options=["5s", "10s", "30s", "1m"], default_interval="10s", label="auto-refresh")
    _none = _typed is not None and not ((_typed / "events.jsonl").is_file() or find_searches(_typed))
    mo.vstack([mo.hstack([mo.md("## Open a search"), refresh_ui], justify="start", gap=2, align="center"), path_ui]
              + ([mo.callout(mo.md(f"No GEPA search at or under `{_typed}` (a search folder holds events.jsonl)."),
                             kind="warn")] if _none else []))
    return folders_now, get_folders, refresh_ui, set_folders


@app.cell
def _(get_folder, get_folders, set_folder):
    _options = get_folders()
    _value = get_folder() if get_folder() in _options else (_options[0] if _options else None)
    run_ui = mo.ui.dropdown(_options, value=_value, label="search folder", on_change=set_folder)
    run_ui
    return (run_ui,)


@app.cell
def _(run_ui):
    get_shown, set_shown = mo.state(watch_key(run_ui.value) if run_ui.value else None)
    return get_shown, set_shown


@app.cell
def _(folders_now, get_folders, get_shown, refresh_ui, run_ui, set_folders, set_shown):
    # Every tick: compare the list of searches and the shown search's files with what the page was drawn from;
    # only a change re-reads and redraws (a finished search never is).
    refresh_ui.value
    _folders = folders_now()
    if sorted(_folders) != sorted(get_folders()):
        set_folders(_folders)
    _shown = watch_key(run_ui.value) if run_ui.value else None
    if _shown != get_shown():
        set_shown(_shown)
    return


@app.cell
def _(get_shown, run_ui):
    get_shown()
    search = load_search(run_ui.value) if run_ui.value else None
    if search is None or not search["cands"]:
        _out = mo.md("_No search yet: launch one above, or run scripts/run_experiment.py with a gepa example._")
    else:
        _s = search["summary"]
        _head = (f"**{search['dir']}**: **{search['status']}**, "
                 + (progress_html(search["metric_calls"], search["budget"], "metric calls") if search["budget"]
                    else f"{search['metric_calls']} metric calls")
                 + f"; {len(search['cands'])} candidates, {search['iterations'].height} iterations, "
                 f"{len(search['releases'])} releases")
        if _s:
            _head += (f"; test: seed harness {_s['seed_test']:.3f} → best (c{_s['best_candidate']}) "
                      f"{_s['best_test']:.3f} ({_s['test_size']} items)")
        _rels = search["index"]["releases"]
        _rel_rows = "".join(
            f"<tr><td>{html.escape(r['version'])}</td><td>c{(r.get('gepa') or {}).get('candidate', '?')}</td>"
            f"<td>{html.escape(str(r.get('parent')))}</td><td>{utc(r.get('created_at'))}</td>"
            f"<td>{hub_cell(r)}</td></tr>"
            for r in _rels)
        _rel_table = mo.Html(
            "<table id='gepa-releases'><thead><tr>" + "".join(
                f"<th style='text-align: left; padding-right: 1.5em'>{h}</th>"
                for h in ("release", "candidate", "parent", "released (UTC)", "Hub revision"))
            + f"</tr></thead><tbody>{_rel_rows}</tbody></table>") if _rels else mo.md("_No release._")
        _out = mo.vstack([mo.md(_head), mo.md(wandb_md(search["wandb"])), svg(plot_search(search), "gepa-figure"),
                          mo.md("### Releases"), _rel_table, mo.md("### Candidate tree"),
                          mo.mermaid(tree_mermaid(search)), mo.md("### Candidates"),
                          mo.ui.table(tidy(search["candidates"]), selection=None, show_column_summaries=False,
                                      show_data_types=False)])
    _out
    return (search,)


@app.cell
def _(get_cand, search, set_cand):
    cand_ui = None
    if search is not None and search["cands"]:
        _ids = [str(i) for i in sorted(search["cands"])]
        cand_ui = mo.ui.dropdown(_ids, value=get_cand() if get_cand() in _ids else _ids[-1], label="candidate",
                                 on_change=set_cand)
    cand_ui
    return (cand_ui,)


@app.cell
def _(cand_ui, search):
    _out = None
    if cand_ui is not None and cand_ui.value is not None:
        _c = search["cands"][int(cand_ui.value)]
        _files = "".join(f"<p><b>{html.escape(k)}</b></p><pre class='gepa-component' style='{PRE}'>"
                         f"{html.escape(v)}</pre>" for k, v in sorted(_c["components"].items()))
        _diff = diff_to_parent(search, _c["id"])
        _answers, _ordered = candidate_answers(search, _c["id"])
        _out = mo.vstack([
            mo.md(f"### Candidate {_c['id']} ({_c['origin']}; parents {_c['parents'] or '-'}; rewrote "
                  f"{_c.get('changed') or '-'}): validation mean {_c['mean']:.3f}"),
            mo.Html(_files), mo.md("**Diff to its parent**"),
            mo.Html(diff_html(_diff)) if _diff else mo.md("_(the seed: no parent)_"),
            mo.md("### Pareto view: each validation item's score under each candidate"),
            mo.Html(pareto_items_html(search, _c["id"])),
            mo.md("Bold on green: the item's Pareto front, the best score on it (above 0) less the dominated "
                  "candidates the search prunes (as gepa 0.1.4 does); grey: an item no candidate scores on. *front* "
                  "marks the candidates a parent is drawn from, with the weights in the last row. Outlined: the "
                  "picked candidate."),
            mo.md(f"### Candidate {_c['id']}'s answers on the validation items"),
            mo.Html("<div id='gepa-candidate-answers'>" + answers_html(
                f"{len(_answers)} answers, mean score {_c['mean']:.3f}" + ("" if _ordered else
                " (an older search: every cached answer of this harness, training items included)"),
                _answers, open_=True) + "</div>"),
            mo.md("### Iterations"),
            mo.ui.table(tidy(search["iterations"]), selection=None, show_column_summaries=False,
                        show_data_types=False)])
    _out
    return


@app.cell
def _(search):
    _out = None
    if search is not None and search["test_answers"]:
        _out = mo.vstack([mo.md(f"### Test answers ({len(search['test_answers'])} saved: the seed harness and the "
                                "best, on the held-out test items)"), mo.Html(test_answers_html(search))])
    elif search is not None and search["summary"]:
        _out = mo.md("_This run saved no test answers._")
    _out
    return


if __name__ == "__main__":
    app.run()
