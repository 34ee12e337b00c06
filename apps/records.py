"""Browse a reef_lab data dir: scenarios, records and reports.

    marimo edit apps/records.py        # notebook, editable
    marimo run apps/records.py         # as an app
    REEF_LAB_DATA_DIR=/path/to/data marimo export html apps/records.py -o out.html   # headless

Read-only and safe while a server writes to the data dir: everything comes from `reef_lab.records.store.scan_records`
(one consistent snapshot per refresh) and the scenario registry. By default it shows what the API shows: records of
registered scenarios created since the scenario was (a deleted or re-created scenario hides older records); tick
"include hidden records" to see everything on disk. Per release: reward and held-out accuracy with the lineage, and
sample answers (what it served, with the reports' scores, and its held-out ones) next to them. An agent's episode
as a conversation (turns, tool calls and results, which tokens a report trains, the reports on it):
apps/conversation.py, docs/apps.md.
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full", app_title="reef_lab records")

with app.setup:
    import html
    import os
    import time
    from datetime import datetime, timedelta, timezone
    from pathlib import Path

    import marimo as mo
    import orjson
    import polars as pl

    ROOT = Path(__file__).resolve().parents[1]

    from apps.conversation import episode_html
    from apps.shared import (answers_html, eval_answers, figure, fit_axes, hub_cell, mean_ci, shown, signature, svg,
                             wandb_md, wandb_runs, wilson)
    from reef_lab.publishing.releases import BASE, ReleaseStore
    from reef_lab.records.record import KINDS, PARQUET_SCHEMA, frame_row_to_dict
    from reef_lab.records.store import scan_records
    from reef_lab.scenarios import stored_scenarios
    from reef_lab.wire import text as wire_text

    SNIPPET = 80
    ALL = "(all)"
    INSPECTED = "(the inspected record's)"
    # Columns the tables and filters need; request/response/feedback JSON are fetched only for shown rows.
    LIGHT = ["id", "scenario", "kind", "dialect", "created_at", "time", "status", "error", "release_id", "score",
             "n_reports", "references", "n_tokens", "mean_logprob", "latency_ms", "visible", "episode"]
    # The files a refresh compares: record logs and segments, the scenario registry, the release indexes.
    DATA_FILES = ("*.bin", "*.parquet", "*.scenario.json", "scenarios.json", "index.json")


@app.function
def loads_json(text):
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


@app.function
def last_user_message(request_json: str | None, dialect: str | None = None) -> str:
    """The text of the last user message of a chat / responses / messages request (reef_lab.wire.text reads it)."""
    return wire_text.last_user_text(dialect, request_json)


@app.function
def answer_text(response_json: str | None, dialect: str | None = None) -> str:
    """The assistant's answer in a chat / responses / messages response, tool calls as [tool_call name]; a relayed
    answer that was not JSON shows raw, a failed call its error."""
    resp = loads_json(response_json)
    if not isinstance(resp, dict):
        return "" if resp is None else str(resp)
    if "raw" in resp:
        return str(resp["raw"])
    parts = [wire_text.response_text(dialect, resp).replace("\n", " ")]
    parts += [f"[tool_call {c.split('(', 1)[0]}]" for c in wire_text.response_calls(dialect, resp)]
    if resp.get("error") and not any(parts):
        parts.append(f"[error] {resp['error']}")
    return " ".join(p for p in parts if p)


@app.function
def snippet(text: str | None, n: int = SNIPPET) -> str:
    s = " ".join((text or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


@app.function
def pretty(value) -> mo.Html:
    """A JSON value (or JSON text) as an indented, escaped <pre> block."""
    if isinstance(value, str):
        value = loads_json(value)
    if value is None:
        return mo.md("_none_")
    text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() if not isinstance(value, str) else value
    return mo.Html(f"<pre style='white-space: pre-wrap; max-height: 28em; overflow: auto; font-size: 0.85em'>"
                   f"{html.escape(text)}</pre>")


@app.function
def feedback_text(feedback_json: str | None) -> str:
    """A report's feedback (JSON text or an object) as one line of text."""
    value = loads_json(feedback_json)
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


@app.function
def utc(ts) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@app.function
def release_rows(data_dir: Path, scenario: str, records_lf: pl.LazyFrame) -> tuple[list[dict], dict]:
    """One row per release of `scenario` (the base model first): its lineage (parent, candidate, when, what it was
    trained on, Hub revision), the traffic it served (inferences, reports on them, mean reward with a 95% interval
    and the change from its parent) and its held-out accuracy (with a 95% Wilson interval). Also the index."""
    index = ReleaseStore(data_dir).index(scenario)
    served = (records_lf.filter(pl.col("scenario") == scenario)
              .group_by("release_id")
              .agg(inferences=(pl.col("kind") == "inference").sum(),
                   scores=pl.col("score").filter((pl.col("kind") == "report") & pl.col("score").is_not_null()))
              .collect())
    by_release = {r["release_id"]: r for r in served.iter_rows(named=True)}

    def row(version: str, release_id: str, parent: str | None, rel: dict | None, ev: dict | None) -> dict:
        got = by_release.get(release_id, {"inferences": 0, "scores": []})
        mean, half = mean_ci(got["scores"]) if got["scores"] else (None, None)
        half = half if len(got["scores"]) > 1 else None  # one report: no interval
        acc, n = (ev or {}).get("accuracy"), (ev or {}).get("n") or (ev or {}).get("size")
        lo, hi = wilson(acc * n, n) if acc is not None and n else (None, None)
        rel = rel or {}
        return {"release": version, "release_id": release_id, "parent": parent, "candidate": rel.get("candidate"),
                "released": utc(rel.get("created_at")), "trainer_step": rel.get("trainer_step"),
                "trained_on": (f"{len(rel.get('records') or [])} records, {len(rel.get('reports') or [])} reports"
                               if rel else ""),
                "serving": (index["serving"] == version) if rel else index["serving"] is None,
                "inferences": got["inferences"], "reports": len(got["scores"]), "reward": mean, "reward_ci": half,
                "heldout": acc, "heldout_n": n, "heldout_lo": lo, "heldout_hi": hi,
                "hub": hub_cell(rel) if rel else ""}

    rows = [row(BASE, BASE, None, None, index.get("base_eval"))]
    for rel in index["releases"]:
        rows.append(row(rel["version"], rel["release_id"], rel.get("parent", BASE).rsplit(":", 1)[-1], rel,
                        rel.get("eval")))
    means = {r["release"]: r["reward"] for r in rows}
    for r in rows:
        parent = means.get(r["parent"]) if r["parent"] else None
        r["reward_change"] = None if parent is None or r["reward"] is None else r["reward"] - parent
    return rows, index


@app.function
def releases_table_html(rows: list[dict], index: dict) -> str:
    def num(v, fmt="{:.3f}"):
        return "" if v is None else fmt.format(v)

    head = ("release", "parent", "candidate", "released (UTC)", "policy step", "trained on", "inferences",
            "reports", "mean reward (95% CI)", "change vs parent", "held-out (95% CI)", "Hub revision")
    body = []
    for r in rows:
        reward = ("" if r["reward"] is None else f"{r['reward']:.3f} (one report)" if r["reward_ci"] is None
                  else f"{r['reward']:.3f} ± {r['reward_ci']:.3f}")
        heldout = ("" if r["heldout"] is None else f"{r['heldout']:.3f} [{r['heldout_lo']:.3f}, {r['heldout_hi']:.3f}]"
                   f" of {r['heldout_n']}")
        cells = [f"<b>{html.escape(r['release'])}</b>" + (" (serving)" if r["serving"] else ""),
                 html.escape(r["parent"] or "—"), html.escape(r["candidate"] or ""), r["released"],
                 num(r["trainer_step"], "{}"), r["trained_on"], str(r["inferences"]), str(r["reports"]), reward,
                 num(r["reward_change"], "{:+.3f}"), heldout, r["hub"]]
        body.append("<tr>" + "".join(f"<td style='padding: 2px 12px 2px 0'>{c}</td>" for c in cells) + "</tr>")
    rollbacks = "".join(f"<li>serving moved back to {html.escape(b['to'])} at {utc(b['at'])} UTC</li>"
                        for b in index.get("rollbacks") or [])
    return ("<table style='width: auto'><thead><tr>"
            + "".join(f"<th style='text-align: left; padding-right: 12px'>{h}</th>" for h in head)
            + f"</tr></thead><tbody>{''.join(body)}</tbody></table>"
            + (f"<p>Rollbacks:</p><ul>{rollbacks}</ul>" if rollbacks else ""))


@app.function
def no_release_text(scenario: str | None) -> str:
    """What "Records by release" says when there is nothing to show: of the scenario picked, else of them all."""
    return f"Scenario `{scenario}` has no release yet." if scenario else "No scenario has a release yet."


@app.function
def served_answers(records_lf: pl.LazyFrame, scenario: str, k: int = 5) -> dict[str, list[dict]]:
    """Per release of `scenario`: the newest `k` scored answers it served (the question, the answer and the mean
    score of the reports on it), in one scan of the records."""
    got = (records_lf.filter((pl.col("scenario") == scenario) & (pl.col("kind") == "inference")
                             & pl.col("release_id").is_not_null() & pl.col("score").is_not_null())
           .sort("created_at", descending=True).group_by("release_id", maintain_order=True).head(k)
           .select("release_id", "id", "dialect", "request", "response", "score").collect())
    out: dict[str, list[dict]] = {}
    for r in got.iter_rows(named=True):
        out.setdefault(r["release_id"], []).append({
            "item": r["id"], "question": snippet(last_user_message(r["request"], r["dialect"]), 300),
            "answer": snippet(answer_text(r["response"], r["dialect"]), 400), "score": round(r["score"], 3)})
    return out


@app.function
def release_answers_html(rows: list[dict], index: dict, scenario: str, records_lf: pl.LazyFrame) -> str:
    """For each release (the base model first): answers it served with their report scores, and its held-out
    evaluation's sample answers (item, expected answer, answer, score), next to its mean reward and held-out score."""
    evals = {BASE: index.get("base_eval"), **{r["version"]: r.get("eval") for r in index["releases"]}}
    by_release = served_answers(records_lf, scenario)
    blocks = []
    for r in rows:
        served = by_release.get(r["release_id"], [])
        heldout = [{**a, "item": f"held-out {a['item']}"} for a in eval_answers(evals.get(r["release"]))]
        reward = "" if r["reward"] is None else f"; mean reward <b>{r['reward']:.3f}</b> over {r['reports']} reports"
        acc = "" if r["heldout"] is None else f"; held-out <b>{r['heldout']:.3f}</b>"
        blocks.append(answers_html(f"<b>{html.escape(r['release'])}</b>: {len(served)} newest scored answers served, "
                                   f"{len(heldout)} held-out{reward}{acc}", served + heldout))
    return f"<div id='records-release-answers'>{''.join(blocks)}</div>"


@app.function
def plot_releases(rows: list[dict], scenario: str):
    """Mean reward of the traffic each release served and its held-out accuracy, release by release."""
    fig, axes = figure(1080, 320, 1, 2)
    ax1, ax2 = axes.flat
    xs = list(range(len(rows)))
    labels = [f"{r['release']}\n{r['reports']} reports" for r in rows]
    pts = [(x, r["reward"], r["reward_ci"] or 0.0) for x, r in zip(xs, rows, strict=True) if r["reward"] is not None]
    if pts:
        ax1.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o", capsize=4)
    ax1.set_title(f"{scenario}: mean reward of the traffic served (95% CI)")
    pts = [(x, r["heldout"], r["heldout"] - r["heldout_lo"], r["heldout_hi"] - r["heldout"])
           for x, r in zip(xs, rows, strict=True) if r["heldout"] is not None]
    if pts:
        ax2.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=[[p[2] for p in pts], [p[3] for p in pts]],
                     marker="o", capsize=4, color="C2")
    ax2.set_title("held-out accuracy (95% Wilson CI)")
    rewards = [v for r in rows if r["reward"] is not None for v in (r["reward"] - (r["reward_ci"] or 0),
                                                                       r["reward"] + (r["reward_ci"] or 0))]
    heldout = [v for r in rows if r["heldout"] is not None for v in (r["heldout_lo"], r["heldout_hi"])]
    for ax, ys in ((ax1, rewards), (ax2, heldout)):
        fit_axes(ax, None, ys)  # x: one release per tick, labelled below
        ax.set_xticks(xs, labels if ax is ax1 else [r["release"] for r in rows])
        ax.set_xlim(-0.5, len(rows) - 0.5)
    return fig


@app.cell
def _():
    mo.md("""
    # reef_lab records

    Scenarios, inferences and reports of one data dir. Times are UTC.
    """)
    return


@app.cell
def _():
    data_dir_input = mo.ui.text(value=os.environ.get("REEF_LAB_DATA_DIR") or "./.reef_lab", label="Data dir",
                                full_width=True)
    # Shown by the cell that makes it: a cell showing it elsewhere would re-run on every tick.
    refresh = mo.ui.refresh(options=["5s", "10s", "30s", "1m"], default_interval="10s", label="auto-refresh")
    mo.hstack([data_dir_input, refresh], widths=[8, 1], align="end")
    return data_dir_input, refresh


@app.cell
def _(data_dir_input):
    def data_files_now() -> tuple:
        return signature(Path(data_dir_input.value.strip() or ".").expanduser(), DATA_FILES)

    get_data_files, set_data_files = mo.state(data_files_now())
    return data_files_now, get_data_files, set_data_files


@app.cell
def _(data_files_now, get_data_files, refresh, set_data_files):
    # Every tick: compare the data dir's files with the last read; only a change re-reads it (selections stay).
    refresh.value
    _now = data_files_now()
    if _now != get_data_files():
        set_data_files(_now)
    return


@app.cell
def _(data_dir_input, get_data_files):
    get_data_files()
    data_dir = Path(data_dir_input.value.strip() or ".").expanduser()
    load_error = None
    registry = None  # the scenarios the data dir holds (reef_lab.scenarios.stored_scenarios); None: no registry
    _reg_schema = {"scenario": pl.String, "recipe": pl.String, "scenario_created_at": pl.Float64}
    _derived = dict(
        time=pl.from_epoch((pl.col("created_at") * 1e6).cast(pl.Int64), time_unit="us")
        .dt.strftime("%Y-%m-%d %H:%M:%S"),
        n_tokens=pl.coalesce(pl.col("token_ids").list.len().cast(pl.Int64),
                             pl.col("response").str.json_path_match("$.usage.completion_tokens").cast(pl.Int64, strict=False),
                             pl.col("response").str.json_path_match("$.usage.output_tokens").cast(pl.Int64, strict=False)),
        mean_logprob=pl.col("logprobs").list.mean(),
        latency_ms=pl.col("timing").str.json_path_match("$.total_ms").cast(pl.Float64, strict=False).round(1),
    )
    try:
        registry = stored_scenarios(data_dir)
        _reg = pl.DataFrame([(s["name"], s.get("recipe"), s.get("created_at")) for s in registry or []],
                            schema=_reg_schema, orient="row")
        _lf = scan_records(data_dir)
    except Exception as _e:  # unreadable dir or registry: show it, do not raise
        load_error = f"{type(_e).__name__}: {_e}"
        registry, _reg = None, pl.DataFrame(schema=_reg_schema)
        _lf = pl.DataFrame(schema=PARQUET_SCHEMA).lazy()
    if registry is None:
        _visible = pl.lit(True)
    else:  # what the API shows: registered scenarios, records since the scenario was (re)created
        _visible = pl.col("scenario_created_at").is_not_null() & (
            pl.col("stored_at").fill_null(pl.col("created_at")) >= pl.col("scenario_created_at") - 1e-6)
    # An inference's score is the mean of the reports on it; a report's release is that of what it reports on.
    _refs = (_lf.filter(pl.col("kind") == "report").select("id", "score", ref=pl.col("references"))
             .explode("ref").filter(pl.col("ref").is_not_null()))
    _on_inference = _refs.group_by("ref").agg(report_score=pl.col("score").mean(), n_reports=pl.len())
    _report_release = (_refs.join(_lf.select(ref="id", ref_release="release_id"), on="ref", how="inner")
                       .group_by("id").agg(pl.col("ref_release").drop_nulls().first()))
    records_lf = (_lf.join(_reg.lazy().select("scenario", "scenario_created_at"), on="scenario", how="left")
                  .join(_on_inference, left_on="id", right_on="ref", how="left")
                  .join(_report_release, on="id", how="left")
                  .with_columns(score=pl.coalesce("score", "report_score"),
                                release_id=pl.coalesce("release_id", "ref_release"),
                                n_reports=pl.col("n_reports").cast(pl.Int64))
                  .with_columns(**_derived).with_columns(visible=_visible.fill_null(False)))
    try:
        records = records_lf.select(LIGHT).collect()
    except Exception as _e:
        load_error = f"{type(_e).__name__}: {_e}"
        records_lf = (pl.DataFrame(schema=PARQUET_SCHEMA).lazy()
                      .with_columns(scenario_created_at=pl.lit(None, pl.Float64),
                                    n_reports=pl.lit(None, pl.Int64)).with_columns(**_derived)
                      .with_columns(visible=pl.lit(True)))
        records = records_lf.select(LIGHT).collect()
    scenarios_registered = _reg
    scenario_names = sorted(set(_reg["scenario"].to_list()) | set(records["scenario"].unique().to_list()))
    release_names = sorted(set(records["release_id"].drop_nulls().to_list()),
                           key=lambda r: (r != BASE, r.rsplit(":v", 1)[0], int(r.rsplit(":v", 1)[-1])
                                          if r.rsplit(":v", 1)[-1].isdigit() else 0, r))
    hidden_count = records.height - records["visible"].sum()
    loaded_at = time.time()
    return (data_dir, hidden_count, load_error, loaded_at, records, records_lf, registry, release_names,
            scenario_names, scenarios_registered)


@app.cell
def _(data_dir, hidden_count, load_error, loaded_at, records, registry):
    if load_error:
        _msg = mo.callout(mo.md(f"**Could not read `{data_dir}`.** {html.escape(load_error)}"), kind="danger")
    elif not data_dir.exists():
        _msg = mo.callout(mo.md(
            f"**No data dir at `{shown(data_dir)}`.** Enter the `--data-dir` of a reef_lab server above "
            "(or set `REEF_LAB_DATA_DIR`), then press Refresh."), kind="warn")
    elif not data_dir.is_dir():
        _msg = mo.callout(mo.md(f"**`{shown(data_dir)}` is not a directory.** Enter a reef_lab data dir above."),
                          kind="warn")
    elif records.height == 0 and not registry:
        _msg = mo.callout(mo.md(
            f"**`{shown(data_dir)}` has no scenarios or records yet.** Send some traffic through the gateway "
            "(`x-reef-scenario` header) and press Refresh."), kind="info")
    else:
        _hidden = (f" {hidden_count} hidden (deleted scenarios or from before a scenario was re-created)."
                   if hidden_count else "")
        _msg = mo.md(f"`{shown(data_dir)}`: {len(registry or [])} scenarios, {records.height} records."
                     f"{_hidden} Read at {utc(loaded_at)}.")
    _msg
    return


@app.cell
def _():
    get_scenario, set_scenario = mo.state(ALL)
    get_release, set_release = mo.state(ALL)
    get_picked_id, set_picked_id = mo.state(None)  # the record picked in the table
    # The picked record's id for a rebuilt table's initial selection (read without re-running that cell).
    picked_memory = {"id": None}
    return (get_picked_id, get_release, get_scenario, picked_memory, set_picked_id, set_release,
            set_scenario)


@app.cell
def _(get_scenario, scenario_names, set_scenario):
    # Its options follow the data (a refresh may bring new scenarios); the choice survives a refresh via state.
    _opts = [ALL, *scenario_names]
    scenario_select = mo.ui.dropdown(_opts, value=get_scenario() if get_scenario() in _opts else ALL,
                                     on_change=set_scenario, searchable=True, label="Scenario")
    return (scenario_select,)


@app.cell
def _(get_release, release_names, set_release):
    _opts = [ALL, *release_names]
    release_select = mo.ui.dropdown(_opts, value=get_release() if get_release() in _opts else ALL,
                                    on_change=set_release, label="Release")
    return (release_select,)


@app.cell
def _():
    # eval records (a candidate's held-out answers, the releaser's) are many and not traffic: off until chosen
    kind_select = mo.ui.multiselect(list(KINDS), value=[k for k in KINDS if k != "eval"], label="Kind")
    status_select = mo.ui.dropdown({ALL: None, "ok": "ok", "error (not ok)": "error"}, value=ALL, label="Status")
    search_input = mo.ui.text(placeholder="text in request / response / feedback JSON", label="Search",
                              full_width=True)
    time_mode = mo.ui.dropdown(["all time", "last N records", "last N minutes", "last N hours", "last N days",
                                "date range"], value="all time", label="When")
    last_n = mo.ui.number(start=1, stop=10**9, value=100, label="N")
    _today = datetime.now(timezone.utc).date()
    date_range = mo.ui.date_range(value=(_today - timedelta(days=7), _today), label="Dates (UTC)")
    include_hidden = mo.ui.checkbox(label="include hidden records")
    row_limit = mo.ui.number(start=10, stop=100_000, step=10, value=500, label="Max rows shown")
    inspect_id = mo.ui.text(placeholder="rec_…  (overrides the table selection while set)",
                            label="Inspect record id", full_width=True)
    return (date_range, include_hidden, inspect_id, kind_select, last_n, row_limit, search_input, status_select,
            time_mode)


@app.cell
def _(date_range, include_hidden, kind_select, last_n, release_select, row_limit, scenario_select, search_input,
      status_select, time_mode):
    # Every filter as one plain dict: the cells below use only this (and a test can pass its own).
    flt = {
        "scenario": None if scenario_select.value == ALL else scenario_select.value,
        "release": None if release_select.value == ALL else release_select.value,
        "kinds": list(kind_select.value),
        "status": status_select.value,
        "search": search_input.value.strip(),
        "time_mode": time_mode.value,
        "n": int(last_n.value or 0),
        "dates": tuple(date_range.value),
        "include_hidden": bool(include_hidden.value),
        "limit": int(row_limit.value or 500),
    }
    return (flt,)


@app.cell
def _(flt, records, scenarios_registered):
    _vis = records if flt["include_hidden"] else records.filter("visible")
    _stats = _vis.group_by("scenario").agg(
        inferences=(pl.col("kind") == "inference").sum(),
        reports=(pl.col("kind") == "report").sum(),
        errors=(pl.col("status") != "ok").sum(),
        mean_score=pl.col("score").filter(pl.col("kind") == "report").mean().round(3),
        last_created_at=pl.col("created_at").max(),
    )
    scenario_table = (
        scenarios_registered.join(_stats, on="scenario", how="full", coalesce=True)
        .with_columns(pl.col("inferences", "reports", "errors").fill_null(0),
                      registered=pl.col("scenario").is_in(scenarios_registered["scenario"].implode()))
        .with_columns(
            created=pl.col("scenario_created_at").map_elements(utc, return_dtype=pl.String),
            last_activity=pl.col("last_created_at").map_elements(utc, return_dtype=pl.String))
        .select("scenario", "recipe", "created", "inferences", "reports", "errors", "mean_score", "last_activity",
                "registered")
        .sort("scenario")
    )
    mo.vstack([mo.md("## Scenarios"),
               mo.ui.table(scenario_table, selection=None, show_column_summaries=False, page_size=10)
               if scenario_table.height else mo.md("_No scenarios._")])
    return (scenario_table,)


@app.cell
def _(data_dir, flt, records_lf, scenario_names):
    # Records by release: did reward go up after each release? The scenario picked above, else the first with one.
    _store = ReleaseStore(data_dir)
    _with = [n for n in scenario_names if _store.index(n)["releases"]]
    release_scenario = flt["scenario"] if flt["scenario"] else (_with[0] if _with else None)
    release_view = None
    if release_scenario is None or not _store.index(release_scenario)["releases"]:
        _out = mo.md(f"## Records by release\n_{no_release_text(release_scenario)}_")
    else:
        release_view, _index = release_rows(data_dir, release_scenario, records_lf)
        _out = mo.vstack([
            mo.md(f"## Records by release: `{release_scenario}`"
                  + ("" if flt["scenario"] else " (pick a scenario above to see another)")),
            mo.Html(f"<div id='records-by-release'>{releases_table_html(release_view, _index)}</div>"),
            svg(plot_releases(release_view, release_scenario), "records-release-figure"),
            mo.md("Reward: the mean score of the reports on the inferences each release served. Held-out: the "
                  "release's own evaluation when it was made. " + wandb_md(wandb_runs(data_dir))),
            mo.md("### Sample answers by release (click to open)"),
            mo.Html(release_answers_html(release_view, _index, release_scenario, records_lf))])
    _out
    return release_scenario, release_view


@app.cell
def _(date_range, include_hidden, kind_select, last_n, release_select, row_limit, scenario_select, search_input,
      status_select, time_mode):
    mo.vstack([
        mo.md("## Records"),
        mo.hstack([scenario_select, release_select, kind_select, status_select, include_hidden], justify="start",
                  gap=2),
        mo.hstack([time_mode, last_n, date_range, row_limit], justify="start", gap=2),
        search_input,
    ])
    return


@app.cell
def _(flt, records_lf):
    _q = records_lf
    if not flt["include_hidden"]:
        _q = _q.filter("visible")
    if flt["scenario"]:
        _q = _q.filter(pl.col("scenario") == flt["scenario"])
    if flt.get("release"):  # records it served, and the reports on them
        _q = _q.filter(pl.col("release_id") == flt["release"])
    _q = _q.filter(pl.col("kind").is_in(flt["kinds"]))
    if flt["status"] == "ok":
        _q = _q.filter(pl.col("status") == "ok")
    elif flt["status"] == "error":
        _q = _q.filter(pl.col("status") != "ok")
    if flt["search"]:
        _needle = flt["search"].lower()
        _q = _q.filter(pl.any_horizontal(
            pl.col(c).fill_null("").str.to_lowercase().str.contains(_needle, literal=True)
            for c in ("request", "response", "feedback")))
    _mode, _n = flt["time_mode"], max(flt["n"], 0)
    _secs = {"last N minutes": 60, "last N hours": 3600, "last N days": 86400}.get(_mode)
    if _secs:
        _q = _q.filter(pl.col("created_at") >= time.time() - _n * _secs)
    elif _mode == "date range" and flt["dates"]:
        _lo, _hi = (datetime.combine(d, datetime.min.time(), timezone.utc).timestamp() for d in flt["dates"])
        _q = _q.filter((pl.col("created_at") >= _lo) & (pl.col("created_at") < _hi + 86400))
    _q = _q.select(LIGHT).sort("created_at", "id", descending=True)
    if _mode == "last N records":
        _q = _q.head(_n)
    filtered = _q.collect()
    return (filtered,)


@app.cell
def _(filtered, flt, picked_memory, records_lf, set_picked_id):
    _page = filtered.head(flt["limit"])
    _ids = _page["id"].implode()
    _texts = (records_lf.filter(pl.col("id").is_in(_ids))
              .select("id", "dialect", "request", "response", "feedback").collect()
              .select("id",
                      user=pl.struct("request", "dialect").map_elements(
                          lambda r: snippet(last_user_message(r["request"], r["dialect"])),
                          return_dtype=pl.String).fill_null(""),
                      answer=pl.struct("response", "dialect").map_elements(
                          lambda r: snippet(answer_text(r["response"], r["dialect"])),
                          return_dtype=pl.String).fill_null(""),
                      own_feedback=pl.col("feedback").map_elements(feedback_text, return_dtype=pl.String)))
    # An inference shows the feedback of the reports on it, newest first.
    _on_inference = (records_lf.filter((pl.col("kind") == "report") & pl.col("feedback").is_not_null())
                     .select("created_at", "feedback", ref=pl.col("references")).explode("ref")
                     .filter(pl.col("ref").is_in(_ids)).sort("created_at", descending=True).collect()
                     .group_by("ref", maintain_order=True)
                     .agg(reports_feedback=pl.col("feedback").map_elements(feedback_text, return_dtype=pl.String)
                          .str.join(" | ")))
    records_view = (_page.join(_texts, on="id", how="left", maintain_order="left")
                    .join(_on_inference, left_on="id", right_on="ref", how="left", maintain_order="left")
                    .select("id", "time", "scenario", "kind", "dialect", "status", "release_id", "episode",
                            pl.col("score").round(3), pl.col("n_reports").alias("reports"),
                            pl.coalesce("own_feedback", "reports_feedback").fill_null("")
                            .map_elements(lambda s: snippet(s, 120), return_dtype=pl.String).alias("feedback"),
                            pl.col("n_tokens").alias("tokens"), "latency_ms", "user",
                            pl.when((pl.col("answer") == "") & pl.col("error").is_not_null())
                            .then(("[error] " + pl.col("error")).str.slice(0, SNIPPET))
                            .otherwise("answer").alias("answer")))
    _reports = filtered.filter(pl.col("kind") == "report")
    _summary = (f"{filtered.height} matching records"
                + (f" (showing the newest {records_view.height})" if records_view.height < filtered.height else "")
                + f": {(filtered['kind'] == 'inference').sum()} inferences, {_reports.height} reports"
                + ("" if _reports["score"].mean() is None else f" (mean score {_reports['score'].mean():.3f})")
                + f", {(filtered['status'] != 'ok').sum()} not ok.")
    def _picked(df) -> None:
        picked_memory["id"] = df["id"][0] if isinstance(df, pl.DataFrame) and df.height else None
        set_picked_id(picked_memory["id"])

    _keep = [k for k, i in enumerate(records_view["id"].to_list()) if i == picked_memory["id"]]
    records_table = mo.ui.table(records_view, selection="single", page_size=15, show_column_summaries=False,
                                show_data_types=False, freeze_columns_left=["id"], label=_summary,
                                initial_selection=_keep, on_change=_picked, wrapped_columns=["feedback"])
    records_table if records_view.height else mo.md("_No records match the filters._")
    return records_table, records_view


@app.cell
def _(get_picked_id, inspect_id):
    # The pick lives in state, not in the table: a refresh that rebuilds the table keeps the inspected record.
    selected_id = inspect_id.value.strip() or get_picked_id()
    return (selected_id,)


@app.cell
def _(inspect_id, records_lf, selected_id):
    inspected, referenced_df, referencing_df = None, None, None
    _out = [mo.md("## Inspect"), inspect_id]
    _row = (records_lf.filter(pl.col("id") == selected_id).collect() if selected_id
            else pl.DataFrame(schema=records_lf.collect_schema()))
    if not selected_id:
        _out.append(mo.md("_Select a row in the records table (or enter a record id) to inspect it._"))
    elif _row.height == 0:
        _out.append(mo.callout(mo.md(f"No record `{html.escape(selected_id)}` in this data dir."), kind="warn"))
    else:
        inspected = frame_row_to_dict(_row.row(0, named=True))
        _r = inspected
        _lp = "" if _r["mean_logprob"] is None else f", mean logprob {_r['mean_logprob']:.4f}"
        _ptoks = f", {len(_r['prompt_token_ids'])} prompt tokens" if _r.get("prompt_token_ids") else ""
        _head = [f"**`{_r['id']}`** · {_r['kind']} · scenario `{_r['scenario']}` · {_r['time']} UTC"
                 + (f" · {_r['dialect']}" if _r["dialect"] else "")
                 + (f" · release `{_r['release_id']}`" if _r["release_id"] else ""),
                 f"status **{_r['status']}**" + (f": {html.escape(_r['error'])}" if _r["error"] else "")
                 + ("" if _r["n_tokens"] is None else f" · {_r['n_tokens']} tokens{_lp}{_ptoks}")
                 + ("" if _r["latency_ms"] is None else f" · {_r['latency_ms']} ms")
                 + ("" if _r["visible"] else " · _hidden from the API_")]
        _out.append(mo.md("  \n".join(_head)))
        _panels = {}
        if _r["kind"] == "report":
            _out.append(mo.md(f"**score:** {_r['score']}"))
            if _r.get("context"):  # the teacher context: words the student did not see (docs/api.md, reports)
                _out.append(mo.Html("<div class='report-context'><b>context</b> (the teacher's words): "
                                    f"<span style='white-space: pre-wrap'>{html.escape(_r['context'])}</span></div>"))
            _panels["feedback"] = pretty(_r["feedback"])
            referenced_df = (records_lf.filter(pl.col("id").is_in(list(_r["references"]))).collect()
                             .select("id", "time", "status", "release_id",
                                     user=pl.struct("request", "dialect").map_elements(
                                         lambda r: snippet(last_user_message(r["request"], r["dialect"]), 200),
                                         return_dtype=pl.String),
                                     answer=pl.struct("response", "dialect").map_elements(
                                         lambda r: snippet(answer_text(r["response"], r["dialect"]), 400),
                                         return_dtype=pl.String))
                             .sort("time"))
            _missing = set(_r["references"]) - set(referenced_df["id"].to_list())
            _out.append(mo.vstack([
                mo.md(f"**references** ({len(_r['references'])})"
                      + (f" — not found: {', '.join(sorted(_missing))}" if _missing else "")),
                mo.ui.table(referenced_df, selection=None, show_column_summaries=False, wrapped_columns=["answer"])
                if referenced_df.height else mo.md("_none_")]))
        else:
            referencing_df = (records_lf.filter((pl.col("kind") == "report")
                                                & pl.col("references").list.contains(_r["id"]))
                              .select("id", "time", "score",
                                      feedback=pl.col("feedback").map_elements(lambda s: snippet(s, 200),
                                                                               return_dtype=pl.String),
                                      context=pl.col("context").map_elements(lambda s: snippet(s, 200),
                                                                             return_dtype=pl.String))
                              .sort("time").collect())
            _out.append(mo.vstack([
                mo.md(f"**reports referencing it** ({referencing_df.height})"),
                mo.ui.table(referencing_df, selection=None, show_column_summaries=False)
                if referencing_df.height else mo.md("_none_")]))
        _panels.update({"request": pretty(_r["request"]), "response": pretty(_r["response"]),
                        "tags": pretty(_r["tags"] or None), "timing": pretty(_r["timing"] or None)})
        if _r["metadata"] is not None:
            _panels["metadata"] = pretty(_r["metadata"])
        _out.append(mo.accordion(_panels, multiple=True))
    mo.vstack(_out)
    return inspected, referenced_df, referencing_df


@app.cell
def _(flt, records):
    # Episodes (an agent's calls grouped by session) of the scenario picked above; the inspected record's by default.
    _vis = records if flt["include_hidden"] else records.filter("visible")
    if flt["scenario"]:
        _vis = _vis.filter(pl.col("scenario") == flt["scenario"])
    _eps = (_vis.filter((pl.col("kind") == "inference") & pl.col("episode").is_not_null())
            .group_by("scenario", "episode").agg(calls=pl.len(), last=pl.col("created_at").max())
            .sort("last", descending=True).head(500))
    episode_select = mo.ui.dropdown(
        {INSPECTED: None, **{f"{e} ({s}, {n} calls)": (s, e)
                             for s, e, n in _eps.select("scenario", "episode", "calls").iter_rows()}},
        value=INSPECTED, label="Episode")
    return (episode_select,)


@app.cell
def _(episode_select, flt, inspected, records_lf):
    # The episode as a conversation: each turn's new messages and answer, the tokens a report trains, its reports.
    episode_shown = None
    if episode_select.value is not None:
        episode_shown = episode_select.value
    elif inspected is not None and inspected.get("episode"):
        episode_shown = (inspected["scenario"], inspected["episode"])
    _out = [mo.md("## Episode"), episode_select]
    if episode_shown is None:
        _out.append(mo.md("_The inspected record belongs to no episode: pick one above, or inspect a record of "
                          "one (its `episode` column)._"))
    else:
        _s, _e = episode_shown
        _lf = records_lf if flt["include_hidden"] else records_lf.filter("visible")
        _lf = _lf.filter((pl.col("scenario") == _s))
        _calls = [frame_row_to_dict(r) for r in _lf.filter((pl.col("kind") == "inference")
                                                           & (pl.col("episode") == _e)).collect().iter_rows(named=True)]
        _ids = [r["id"] for r in _calls]
        _on = (_lf.filter(pl.col("kind") == "report").select("id", ref=pl.col("references")).explode("ref")
               .filter(pl.col("ref").is_in(_ids)).select("id").unique().collect()["id"].to_list())
        _reports = [frame_row_to_dict(r) for r in
                    _lf.filter((pl.col("kind") == "report") & ((pl.col("episode") == _e) | pl.col("id").is_in(_on)))
                    .sort("created_at", "id").collect().iter_rows(named=True)]
        _out.append(mo.Html(episode_html(_e, _s, _calls, _reports)) if _calls
                    else mo.md(f"_Episode `{html.escape(_e)}` has no calls in scenario `{html.escape(_s)}`._"))
    mo.vstack(_out)
    return (episode_shown,)


@app.cell
def _(filtered):
    # Histogram of the filtered reports' scores: one bar per value when there are few, else 10 equal bins.
    _s = filtered.filter((pl.col("kind") == "report") & pl.col("score").is_not_null())["score"]
    _schema = {"bin": pl.String, "lo": pl.Float64, "hi": pl.Float64, "count": pl.UInt32}
    if _s.len() == 0:
        score_hist = pl.DataFrame(schema=_schema)
    elif _s.n_unique() <= 12:
        score_hist = (_s.value_counts().sort("score")
                      .select(bin=pl.col("score").round(4).cast(pl.String), lo="score", hi="score",
                              count=pl.col("count").cast(pl.UInt32)))
    else:
        _h = _s.hist(bin_count=10)
        score_hist = _h.select(bin=pl.col("category").cast(pl.String),
                               lo=pl.col("breakpoint").shift(1, fill_value=_s.min()), hi="breakpoint",
                               count=pl.col("count").cast(pl.UInt32))
    if score_hist.height:
        _max = max(score_hist["count"].max(), 1)
        _rows = "".join(
            f"<tr><td style='text-align:right; padding-right:8px; white-space:nowrap'>{html.escape(b)}</td>"
            f"<td style='width:100%'><div style='background:#4c78a8; height:1em; width:{100 * c / _max:.1f}%'>"
            f"</div></td><td style='padding-left:8px'>{c}</td></tr>"
            for b, c in score_hist.select("bin", "count").iter_rows())
        _chart = mo.Html(f"<table style='width:100%; max-width:48em'>{_rows}</table>")
    else:
        _chart = mo.md("_No scored reports match the filters._")
    mo.vstack([mo.md(f"## Score histogram ({_s.len()} scored reports, mean "
                     f"{'—' if _s.len() == 0 else format(_s.mean(), '.3f')})"), _chart])
    return (score_hist,)


if __name__ == "__main__":
    app.run()
