"""Harness releases of a live data dir: the release chain with the change each made, and the change requests.

    marimo run apps/harness.py              # as an app (marimo edit: as a notebook)
    REEF_LAB_DATA_DIR=/path/to/data marimo export html apps/harness.py -o out.html   # headless

For a scenario whose recipe evolves a harness (gepa): every release (version, parent, which serves, what made it:
a change request's words, GEPA's search, or a hand publish; the selection's verdict; its Hub revision), one
release's files with a coloured diff to its parent and its request (summary, mutations, session), the requests in
flight (queued, proposing, evaluating, waiting for a person's promote) and every request with its state and why.
Read-only: release indexes (`releases/<scenario>/index.json`), release folders and request files
(`requests/req_*.json`, reef_lab/harness/change_requests.py). Auto-refresh re-reads only when one of them changed.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab harness")

with app.setup:
    import difflib
    import html
    import os
    from pathlib import Path

    import marimo as mo
    import orjson
    import polars as pl

    from apps.shared import hub_cell, signature, tidy, utc
    from reef_lab.harness.tree import read_tree
    from reef_lab.harness.change_requests import OPEN, RequestStore

    DATA_FILES = ("index.json", "*.json")
    PRE = "white-space: pre-wrap; overflow-wrap: anywhere; margin: 0.3em 0 0.8em; font-size: 0.85em"
    DIFF_STYLE = {"+": "background: #e6ffec; color: #1a7f37", "-": "background: #ffebe9; color: #cf222e",
                  "@": "background: #ddf4ff; color: #0550ae"}
    STATE_STYLE = {"released": "#dafbe1", "rejected": "#ffebe9", "pending_review": "#fff8c5"}


@app.function
def harness_scenarios(data_dir: Path) -> list[str]:
    """Scenarios with a harness release or a change request."""
    names = set()
    for idx in sorted((data_dir / "releases").glob("*/index.json")):
        rels = orjson.loads(idx.read_bytes()).get("releases") or []
        if any(r.get("kind") == "harness" for r in rels):
            names.add(idx.parent.name)
    names |= {r["scenario"] for r in RequestStore(data_dir).list()}
    return sorted(names)


@app.function
def load_view(data_dir: Path, scenario: str) -> dict:
    """The scenario's release index, its releases' file trees and its change requests."""
    path = data_dir / "releases" / scenario / "index.json"
    index = orjson.loads(path.read_bytes()) if path.exists() else {"serving": None, "releases": [], "candidates": []}
    trees = {r["version"]: read_tree(Path(r["folder"])) for r in index["releases"]
             if r.get("kind") == "harness" and Path(r["folder"]).is_dir()}
    return {"scenario": scenario, "index": index, "trees": trees, "requests": RequestStore(data_dir).list(scenario)}


@app.function
def origin_of(rel: dict) -> str:
    """What made a release: a change request's words, a GEPA candidate, or a hand publish."""
    req = rel.get("request") or {}
    if req.get("text"):
        return f"request: {req['text']}"
    gepa = rel.get("gepa") or {}
    if gepa.get("origin") == "seed":
        return "the recipe's seed harness"
    if gepa:
        return f"GEPA candidate {gepa.get('candidate')} ({gepa.get('reason') or ''})".replace(" ()", "")
    return f"published by hand ({rel.get('recipe') or 'manual'})"


@app.function
def verdict_of(rel: dict) -> str:
    return str((rel.get("request") or {}).get("verdict") or (rel.get("gepa") or {}).get("reason") or "")


@app.function
def chain_html(view: dict) -> str:
    """The release chain, newest first: version, parent, serving, created, what made it, verdict, Hub revision."""
    idx = view["index"]
    serving = idx.get("serving")
    rows = []
    for r in reversed([r for r in idx["releases"] if r.get("kind") == "harness"]):
        mark = "<b>serving</b>" if r["version"] == serving else ""
        rows.append(
            f"<tr class='harness-release' data-version='{r['version']}' style='border-bottom: 1px solid #e5e7eb'>"
            f"<td style='padding: 2px 10px'><b>{r['version']}</b> {mark}</td>"
            f"<td style='padding: 2px 10px'>{html.escape(str(r.get('parent', '')).split(':')[-1])}</td>"
            f"<td style='padding: 2px 10px'>{utc(r.get('created_at'))}</td>"
            f"<td style='{PRE}; padding: 2px 10px; max-width: 34em'>{html.escape(origin_of(r))}</td>"
            f"<td style='{PRE}; padding: 2px 10px; max-width: 22em'>{html.escape(verdict_of(r))}</td>"
            f"<td style='padding: 2px 10px'>{hub_cell(r)}</td></tr>")
    head = "".join(f"<th style='text-align: left; padding: 2px 10px'>{h}</th>" for h in
                   ("release", "parent", "created (UTC)", "what made it", "verdict", "Hub revision"))
    return (f"<table id='harness-chain' style='width: auto'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


@app.function
def release_diff(view: dict, version: str) -> str:
    """Unified diff of a release's files against its parent's ('' for a first release)."""
    rel = next(r for r in view["index"]["releases"] if r["version"] == version)
    parent = str(rel.get("parent") or "").split(":")[-1]
    old, new = view["trees"].get(parent, {}), view["trees"].get(version, {})
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a != b:
            out += difflib.unified_diff((a or "").splitlines(), (b or "").splitlines(),
                                        f"{parent or 'none'}/{name}" if a is not None else "/dev/null",
                                        f"{version}/{name}" if b is not None else "/dev/null", lineterm="")
    return "\n".join(out)


@app.function
def diff_html(diff: str) -> str:
    lines = []
    for line in diff.splitlines():
        kind = ("" if line.startswith(("+++", "---")) else "diff-add" if line.startswith("+")
                else "diff-del" if line.startswith("-") else "diff-hunk" if line.startswith("@@") else "")
        style = DIFF_STYLE.get(line[:1], "") if kind else "color: #57606a"
        lines.append(f"<span class='{kind}' style='display: block; {style}'>{html.escape(line) or ' '}</span>")
    return f"<pre class='harness-diff' style='{PRE}'>{''.join(lines) or '(no change to its parent)'}</pre>"


@app.function
def requests_frame(view: dict, only_open: bool = False) -> pl.DataFrame:
    """The change requests (newest first): state, why, what was asked, the release or candidate it made."""
    rows = [{"id": r["id"], "state": r["state"], "created_at": r["created_at"], "text": r["text"],
             "session": r.get("session") or "", "summary": r.get("summary") or "", "why": r.get("why") or "",
             "candidate": r.get("candidate") or "", "release": r.get("release") or ""}
            for r in reversed(view["requests"]) if not only_open or r["state"] in (*OPEN, "pending_review")]
    schema = {"id": pl.String, "state": pl.String, "created_at": pl.Float64, "text": pl.String,
              "session": pl.String, "summary": pl.String, "why": pl.String, "candidate": pl.String,
              "release": pl.String}
    return tidy(pl.DataFrame(rows, schema=schema))


@app.function
def request_html(req: dict | None) -> str:
    """One request in full: its words, state and why, the proposer's summary and mutations, its session."""
    if req is None:
        return "<p><i>Made by no change request.</i></p>"
    colour = STATE_STYLE.get(req["state"], "#ddf4ff")
    muts = "".join(f"<li><code>{html.escape(m.get('op', '?'))} {html.escape(m.get('kind', '?'))}</code> "
                   f"{html.escape(str(m.get('name') or m.get('path') or m.get('text') or '')[:120])}</li>"
                   for m in req.get("mutations") or [] if isinstance(m, dict))
    return (f"<div class='harness-request' id='request-{req['id']}'>"
            f"<p><b>Request</b> <code>{req['id']}</code> <span style='background: {colour}; padding: 1px 6px'>"
            f"{req['state']}</span>{(' — ' + html.escape(req['why'])) if req.get('why') else ''}</p>"
            f"<blockquote style='{PRE}'>{html.escape(req['text'])}</blockquote>"
            f"<p>Session: <code>{html.escape(str(req.get('session')))}</code> "
            f"({req.get('session_calls', 0)} calls shown to the proposer); seen release "
            f"<code>{html.escape(str(req.get('seen_release')))}</code>.</p>"
            f"<p>Proposer's summary: {html.escape(req.get('summary') or '')}</p>"
            f"<ul>{muts}</ul><p>Verdict: {html.escape(str(req.get('review') or ''))}</p></div>")


@app.cell
def _():
    mo.md("""
    # reef_lab harness

    Harness releases of a scenario and the change requests behind them. Times are UTC.
    """)
    return


@app.cell
def _():
    data_dir_input = mo.ui.text(value=os.environ.get("REEF_LAB_DATA_DIR") or "./.reef_lab", label="Data dir",
                                full_width=True)
    refresh = mo.ui.refresh(options=["5s", "10s", "30s", "1m"], default_interval="10s", label="auto-refresh")
    mo.hstack([data_dir_input, refresh], widths=[8, 1], align="end")
    return data_dir_input, refresh


@app.cell
def _(data_dir_input):
    def files_now() -> tuple:
        d = Path(data_dir_input.value.strip() or ".").expanduser()
        return signature(d / "releases", ("index.json",), max_depth=2) + signature(d / "requests", ("*.json",), 1)

    get_files, set_files = mo.state(files_now())
    return files_now, get_files, set_files


@app.cell
def _(files_now, get_files, refresh, set_files):
    refresh.value  # every tick: re-read only when an index or a request file changed (selections stay)
    _now = files_now()
    if _now != get_files():
        set_files(_now)
    return


@app.cell
def _(data_dir_input, get_files):
    get_files()
    data_dir = Path(data_dir_input.value.strip() or ".").expanduser()
    scenario_names = harness_scenarios(data_dir) if data_dir.is_dir() else []
    return data_dir, scenario_names


@app.cell
def _():
    get_scenario, set_scenario = mo.state(None)
    get_version, set_version = mo.state(None)
    return get_scenario, get_version, set_scenario, set_version


@app.cell
def _(data_dir, get_scenario, scenario_names, set_scenario):
    if not scenario_names:
        scenario_select = None
        _out = mo.callout(mo.md(
            f"**No harness scenario in `{data_dir}`.** Point the data dir at a server's `--data-dir` whose scenarios "
            "use recipe `gepa` (or set `REEF_LAB_DATA_DIR`)."), kind="warn")
    else:
        _value = get_scenario() if get_scenario() in scenario_names else scenario_names[0]
        scenario_select = mo.ui.dropdown(scenario_names, value=_value, label="Scenario", on_change=set_scenario)
        _out = scenario_select
    _out
    return (scenario_select,)


@app.cell
def _(data_dir, get_files, scenario_select):
    get_files()
    view = load_view(data_dir, scenario_select.value) if scenario_select is not None else None
    return (view,)


@app.cell
def _(view):
    mo.stop(view is None)
    _flight = requests_frame(view, only_open=True)
    mo.vstack([
        mo.md(f"## Release chain of `{view['scenario']}`"),
        mo.Html(chain_html(view)),
        mo.md(f"## Requests in flight ({_flight.height})"),
        mo.ui.table(_flight, selection=None, label="requests in flight") if _flight.height else
        mo.md("_None: every request is released or rejected._"),
    ])
    return


@app.cell
def _(get_version, set_version, view):
    mo.stop(view is None or not view["trees"])
    _versions = [r["version"] for r in reversed(view["index"]["releases"]) if r["version"] in view["trees"]]
    version_select = mo.ui.dropdown(_versions, value=get_version() if get_version() in _versions else _versions[0],
                                    label="Release", on_change=set_version)
    version_select
    return (version_select,)


@app.cell
def _(version_select, view):
    mo.stop(view is None or not view["trees"])
    _rel = next(r for r in view["index"]["releases"] if r["version"] == version_select.value)
    _req_id = (_rel.get("request") or {}).get("id")
    _req = next((r for r in view["requests"] if r["id"] == _req_id), None)
    _files = view["trees"][version_select.value]
    _tree = "".join(f"<details><summary><code>{html.escape(p)}</code></summary>"
                    f"<pre style='{PRE}'>{html.escape(t)}</pre></details>" for p, t in sorted(_files.items()))
    mo.vstack([
        mo.md(f"### {version_select.value}: {html.escape(origin_of(_rel))}"),
        mo.Html(f"<div id='harness-release-{version_select.value}'>{request_html(_req)}"
                f"<p><b>Diff to its parent</b> ({_rel.get('parent')})</p>"
                f"{diff_html(release_diff(view, version_select.value))}"
                f"<p><b>Its files</b></p>{_tree}</div>"),
    ])
    return


@app.cell
def _(view):
    mo.stop(view is None)
    _all = requests_frame(view)
    mo.vstack([mo.md(f"## Every change request ({_all.height})"),
               mo.ui.table(_all, selection=None, label="change requests") if _all.height else
               mo.md("_No change request yet: `POST /reef/train {\"text\": ...}` or `reef-lab agent <agent> evolve`._")])
    return


if __name__ == "__main__":
    app.run()
