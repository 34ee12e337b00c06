"""What the apps draw and say, on small run folders written here: readable axes on every chart (one point, a constant
series, TTT steps), GEPA's Pareto marks as the search computes them, a search opened from any path, the records
app's wording, and sample answers next to their scores."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import marimo as mo
import orjson
import pytest

from tests.test_apps import data_dir, load_module  # noqa: F401  (data_dir: a fixture)


# ---- charts -------------------------------------------------------------------------------------------------------
def axis_problems(fig, step_label: str = "step") -> list[str]:
    """What is wrong with a figure's axes: an offset label, a step axis with fractional or no visible ticks, a value
    axis zoomed into rounding noise."""
    fig.canvas.draw()
    out = []
    for k, ax in enumerate(fig.axes):
        for name, axis, (lo, hi) in (("x", ax.xaxis, ax.get_xlim()), ("y", ax.yaxis, ax.get_ylim())):
            if axis.get_offset_text().get_text():
                out.append(f"axes {k} {name}: offset label {axis.get_offset_text().get_text()!r}")
            if axis.get_scale() == "linear" and hi - lo < 1e-3 * max(abs(lo), abs(hi), 1e-12):
                out.append(f"axes {k} {name}: range {lo!r}..{hi!r}")
        if step_label in ax.get_xlabel():
            lo, hi = sorted(ax.get_xlim())
            ticks = [t for t in ax.get_xticks() if lo - 1e-9 <= t <= hi + 1e-9]
            if not ticks or any(not float(t).is_integer() for t in ticks):
                out.append(f"axes {k} ({ax.get_title()!r}): step ticks {ticks}")
    return out


def sao_run(folder: Path, steps: list[dict]) -> Path:
    """A weight run folder as scripts/run_experiment.py leaves it: config, metrics rows, a release index whose
    candidates kept their evaluation's sample answers."""
    learn = folder / "data" / "learn" / "x"
    learn.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"name": "x", "recipe": "sao", "seed": 0, "rollouts": 8,
                                                    "recipe_config": {"eval_size": 4}}))
    t = time.time()
    rows = [{"event": "eval", "release_id": "base", "accuracy": 0.25, "time": t}]
    rows += [{"event": "step", "phase": "policy", "time": t, **s} for s in steps]
    rows += [{"event": "candidate", "candidate": "c0001", "status": "accepted", "trainer_step": steps[-1]
              ["trainer_step"], "accuracy": 0.5, "time": t},
             {"event": "release", "release_id": "x:v1", "trainer_step": steps[-1]["trainer_step"], "accuracy": 0.5,
              "time": t}]
    (learn / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = [{"id": "q1", "answer": "12", "text": "The answer is 12", "score": 1.0},
                {"id": "q2", "answer": "7", "text": "eight", "score": 0.0}]
    ev = {"accuracy": 0.5, "n": 4, "examples": examples}
    index = {"serving": "v1", "base_eval": {"accuracy": 0.25, "n": 4, "examples": examples[1:]},
             "candidates": [{"id": "c0001", "status": "accepted", "trainer_step": steps[-1]["trainer_step"],
                             "eval": ev, "release_id": "x:v1"}],
             "releases": [{"version": "v1", "release_id": "x:v1", "candidate": "c0001", "parent": "base",
                           "trainer_step": steps[-1]["trainer_step"], "created_at": t, "eval": ev}]}
    (folder / "data" / "releases" / "x").mkdir(parents=True)
    (folder / "data" / "releases" / "x" / "index.json").write_text(json.dumps(index))
    return folder


@pytest.mark.parametrize("steps", [
    [{"trainer_step": 1, "reward_mean": 0.3, "loss": 0.0, "masked_fraction": 0.1}],  # one point
    [{"trainer_step": k, "reward_mean": 0.3 + k * 1e-8, "loss": 1e-7, "masked_fraction": 0.1} for k in (1, 2, 3)],
], ids=["one-step", "constant"])
def test_sao_charts_have_readable_axes(tmp_path, steps):
    sao = load_module("sao")
    run = sao.load_run(sao_run(tmp_path / "run", steps))
    assert axis_problems(sao.plot_run(run)) == []
    assert axis_problems(sao.plot_compare([run])) == []


def test_sao_app_plots_what_the_reports_say_per_step(tmp_path):
    """A tool-task run's steps carry report_<key> means (the learner averages report metadata): the app draws one
    panel per key, tool-call validity and task success titled as such, with each step's value; a run without them
    draws none."""
    sao = load_module("sao")
    steps = [{"trainer_step": k, "reward_mean": r, "report_correct": r, "report_valid_call_fraction": v,
              "report_valid_calls": c} for k, r, v, c in ((1, 0.25, 0.5, 1.0), (2, 0.5, 0.75, 1.5), (3, 0.5, 1.0, 2.0))]
    run = sao.load_run(sao_run(tmp_path / "run", steps))
    assert run["reported"] == ["report_correct", "report_valid_call_fraction", "report_valid_calls"]
    fig = sao.plot_reports(run)
    assert axis_problems(fig) == []
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["task success (answer correct)",
                                                "tool-call validity (valid calls / calls)",
                                                "valid tool calls per episode"]
    validity = shown[1].lines[0]
    assert list(validity.get_xdata()) == [1, 2, 3] and list(validity.get_ydata()) == [0.5, 0.75, 1.0]
    plain = sao.load_run(sao_run(tmp_path / "plain", [{"trainer_step": 1, "reward_mean": 0.3}]))
    assert plain["reported"] == [] and sao.plot_reports(plain) is None


def test_sao_app_plots_a_distillation_runs_divergence_and_teacher_gap(tmp_path):
    """The weights app opens a distillation run (opd, sdft, sdpo, ctxd: reef_lab.learning.distill.distill_step's
    rows): one panel each for the divergence, the teacher-student gap and a context's saved prompt tokens, with each
    step's value; a run of another recipe draws none."""
    sao = load_module("sao")
    steps = [{"trainer_step": k, "loss": 0.1, "forward_kl": kl, "teacher_gap": g, "prompt_tokens_saved": 41.0}
             for k, kl, g in ((1, 0.9, -1.5), (2, 0.6, -1.0), (3, 0.4, -0.5))]
    run = sao.load_run(sao_run(tmp_path / "run", steps))
    assert run["distilled"] == ["forward_kl", "teacher_gap", "prompt_tokens_saved"]
    fig = sao.plot_distill(run)
    assert axis_problems(fig) == []
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in shown] == ["forward KL(teacher || student), teacher's top-K",
                                                "teacher - student log-prob, generated tokens",
                                                "prompt tokens saved per call (context distilled)"]
    gap = shown[1].lines[0]
    assert list(gap.get_xdata()) == [1, 2, 3] and list(gap.get_ydata()) == [-1.5, -1.0, -0.5]
    assert gap.get_gid() == "distill-teacher_gap"
    plain = sao.load_run(sao_run(tmp_path / "plain", [{"trainer_step": 1, "reward_mean": 0.3}]))
    assert plain["distilled"] == [] and sao.plot_distill(plain) is None


def test_ttt_charts_number_steps_as_the_metrics_rows_do(monkeypatch):
    from recipes.tttd.archive import Archive

    ttt = load_module("ttt")
    drawn = []
    monkeypatch.setattr(ttt, "svg", lambda fig, fig_id: drawn.append(fig))
    rows = [{"step": k, "best_reward": 0.4, "mean_reward": 0.2, "step_best": 0.4, "betas": [0.5, None]}
            for k in (1, 2, 3)]
    archive = Archive()
    start = archive.add_initial("start", 0.1)
    parent = start
    for t in range(3):  # the archive counts steps from 0; rows 1..3
        parent = archive.expand(parent.id, [(f"s{t}", 0.2 + t / 10)], step=t)[0]
    ttt.plot_progress({"rows": rows})
    ttt.plot_tree(archive)
    progress, tree = drawn
    assert axis_problems(progress) == [] and axis_problems(tree) == []
    made = sorted({round(x) for x, _ in tree.axes[0].collections[0].get_offsets()})
    assert made == [0, 1, 2, 3]  # 0: the initial state; the state made in row k's step at k
    assert "0: initial" in tree.axes[0].get_xlabel()
    # one step only: a single integer tick, not -0.04 .. 0.04
    drawn.clear()
    ttt.plot_progress({"rows": rows[:1]})
    assert axis_problems(drawn[0]) == []


def test_gepa_and_records_charts_of_a_single_point(tmp_path):
    gepa = load_module("gepa")
    folder = tmp_path / "search"
    folder.mkdir()
    events = [{"event": "candidate", "id": 0, "origin": "seed", "parents": [], "changed": None,
               "components": {"a.md": "x"}, "scores": [0.5, 0.5], "mean": 0.5, "metric_calls": 2},
              {"event": "front", "front": {"0": 2}, "best": 0, "best_mean": 0.5, "metric_calls": 2}]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert axis_problems(gepa.plot_search(gepa.load_search(folder)), step_label="pool update") == []
    records = load_module("records")
    row = {"release": "base", "reports": 1, "reward": 1.0, "reward_ci": None, "heldout": 0.5, "heldout_lo": 0.5,
           "heldout_hi": 0.5}
    assert axis_problems(records.plot_releases([row], "s")) == []


def test_fit_axes_pads_a_point_and_a_constant_and_leaves_a_spread_alone():
    from apps.shared import figure, fit_axes

    fig, axes = figure(600, 300, 1, 3)
    one, flat, spread = axes.flat
    one.plot([4], [0.0], marker="o")
    fit_axes(one, [4], [0.0])
    flat.plot([1, 2], [0.3, 0.3000001])
    fit_axes(flat, [1, 2], [0.3, 0.3000001])
    spread.plot([0, 10], [0.1, 0.9])
    fit_axes(spread, [0, 10], [0.1, 0.9])
    assert axis_problems(fig, step_label="") == []
    assert one.get_xlim() == (3.5, 4.5) and one.get_ylim() == (-0.5, 0.5)
    assert flat.get_ylim() == pytest.approx((0.27, 0.33))
    assert spread.get_xlim()[0] < 0 and spread.get_xlim()[1] > 10  # matplotlib's own margins


# ---- GEPA: the Pareto table, a path field, candidates' answers -----------------------------------------------------
def search_of(scores: dict[int, list[float]]) -> dict:
    return {"cands": {c: {"id": c, "scores": s, "components": {}, "parents": []} for c, s in scores.items()}}


def front_cells(table: str) -> dict[str, list[str]]:
    """Each body row of the Pareto table: the candidates whose cell is marked (bold on green) as the item's front."""
    out = {}
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table.split("<tbody>")[1].split("</tbody>")[0]):
        label = re.search(r"<td[^>]*>(val-\d+)", row).group(1)
        cells = re.findall(r"<td[^>]*style='([^']*)'[^>]*>[\d.]*</td>", row)
        out[label] = [f"c{k}" for k, style in enumerate(cells) if "font-weight: 700" in style]
    return out


def test_gepa_pareto_table_marks_the_front_as_the_search_computes_it():
    gepa = load_module("gepa")
    # c1 ties c0 on val-0 but is worse on val-1: dominated, never front; val-2 nobody scores on
    table = gepa.pareto_items_html(search_of({0: [1, 1, 0], 1: [1, 0.5, 0], 2: [0, 0, 0]}), picked=1)
    assert front_cells(table) == {"val-0": ["c0"], "val-1": ["c0"], "val-2": []}
    assert "(no candidate scores)" in table and table.count("class='gepa-front'") == 1
    foot = re.findall(r"<tr><td[^>]*><i>([^<]*)</i></td>(.*?)</tr>", table.split("<tfoot>")[1])
    counts = {name: re.findall(r">(\d+)</td>", cells) for name, cells in foot}
    assert counts == {"best on": ["2", "0", "0"], "parent-draw weight": ["3", "0", "0"]}
    # set-dominated without being beaten item by item: c0's items each have another front candidate (gepa prunes it)
    table = gepa.pareto_items_html(search_of({0: [1, 1, 0], 1: [1, 0, 1], 2: [0, 1, 1]}), picked=None)
    assert front_cells(table) == {"val-0": ["c1"], "val-1": ["c2"], "val-2": ["c1", "c2"]}


@pytest.fixture
def gepa_search(tmp_path, stub_url):
    """A GEPA experiment on the loopback stub, written outside the repository's folders."""
    from recipes.gepa.experiment import GEPAExperimentConfig, run_gepa_experiment

    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    cfg = GEPAExperimentConfig(name="calc", task={"name": "arithmetic"}, train_size=4, val_size=3, test_size=2,
                               task_lm=lm, reflection_lm=lm, out_dir=str(tmp_path / "elsewhere" / "calc-seed0"),
                               search={"max_metric_calls": 16, "minibatch_size": 2})
    run_gepa_experiment(cfg, progress=False)
    return Path(cfg.out_dir)


def test_gepa_app_opens_a_typed_path_and_shows_each_candidates_answers(gepa_search, monkeypatch):
    monkeypatch.delenv("REEF_LAB_RUN", raising=False)
    gepa = load_module("gepa")
    for typed in (gepa_search, gepa_search.parent):  # the search itself, or a folder holding it
        _, env = gepa.app.run(defs={"path_ui": mo.ui.text(value=str(typed))})
        assert env["run_ui"].value == str(gepa_search) and env["search"]["dir"] == str(gepa_search)
    search = env["search"]
    state = orjson.loads((gepa_search / "state.json").read_bytes())
    assert len(state["val_ids"]) == 3
    for cid, cand in search["cands"].items():
        answers, ordered = gepa.candidate_answers(search, cid)
        assert ordered and [a["score"] for a in answers] == cand["scores"]
        assert [a["item"].split()[1] for a in answers] == [f"({i})" for i in state["val_ids"]]
        assert all(a["answer"] is not None and a["question"] for a in answers)
    _, env = gepa.app.run(defs={"path_ui": mo.ui.text(value=str(gepa_search.parent / "nothing-here"))})
    assert env["run_ui"].value != str(gepa_search.parent / "nothing-here")


# ---- records: wording; sample answers per release and per candidate ------------------------------------------------
def shown(outputs) -> str:
    return " ".join(getattr(o, "text", "") for o in outputs)


def test_records_app_says_plainly_when_no_scenario_has_a_release(data_dir):  # noqa: F811
    records = load_module("records")
    outputs, env = records.app.run()
    assert "No scenario has a release yet." in shown(outputs) and "has no release yet" not in shown(outputs)
    outputs, _ = records.app.run(defs={"flt": {**env["flt"], "scenario": "alpha"}})
    assert "Scenario <code>alpha</code> has no release yet." in shown(outputs)
    assert records.no_release_text(None) == "No scenario has a release yet."


def test_records_app_shows_each_releases_answers_next_to_its_scores(data_dir):  # noqa: F811
    examples = [{"id": "q7", "answer": "4", "text": "2 + 2 = 4", "score": 1.0}]
    index = {"serving": "v1", "candidates": [], "base_eval": {"accuracy": 0.0, "n": 1, "examples": []},
             "releases": [{"version": "v1", "release_id": "rel-1", "candidate": "c0001", "parent": "base",
                           "created_at": time.time(), "eval": {"accuracy": 1.0, "n": 1, "examples": examples}}]}
    (data_dir / "releases" / "alpha").mkdir(parents=True)
    (data_dir / "releases" / "alpha" / "index.json").write_text(json.dumps(index))
    outputs, env = load_module("records").app.run()
    text = shown(outputs)
    block = text[text.index("records-release-answers"):]
    v1 = block[block.index("<b>v1</b>"):]
    # what rel-1 served, with the mean score of the reports on it, and its held-out answer
    assert "A ridge of coral." in v1 and "What is a reef?" in v1 and ">0.5</td>" in v1
    assert "held-out q7" in v1 and "2 + 2 = 4" in v1 and "mean reward <b>0.667</b> over 3 reports" in v1


def test_sao_app_shows_each_candidates_answers(tmp_path):
    sao = load_module("sao")
    run = sao.load_run(sao_run(tmp_path / "run", [{"trainer_step": 1, "reward_mean": 0.3}]))
    html = sao.answers_by_candidate_html(run)
    cand, base = html.split("base model")
    assert "candidate c0001" in cand and "release <b>v1</b>" in cand and "accuracy <b>0.500</b>" in cand
    assert "The answer is 12" in cand and "eight" in cand and "eight" in base and "The answer is 12" not in base


# ---- records: an episode as a conversation --------------------------------------------------------------------------
@pytest.fixture
def episode_data(tool_model, tokenizer, tmp_path, monkeypatch):
    """A data dir holding one real two-turn tool loop (the tiny tool model through the chat SDK, as
    tests/test_episodes.py makes one), a report on the episode with feedback, and a call of no episode."""
    import requests

    from reef_lab.engines.embedded import EmbeddedEngine
    from reef_lab.gateway.gateway import Gateway
    from tests.conftest import Running
    from reef_lab.gateway.gateway import RECEIPT_HEADER
    from tests.test_episodes import session_client, tool_loop

    d = tmp_path / "data"
    r = Running(Gateway(d, EmbeddedEngine(tool_model, tokenizer, "tiny", max_batch=8)))
    try:
        c = session_client(r.url, "chat", "agent", "run-1")
        tool_loop(c, stream=False)
        got = requests.get(f"{r.url}/reef/episodes/run-1", headers={"x-reef-scenario": "agent"}, timeout=60).json()
        rep = requests.post(f"{r.url}/reef/report", headers={"x-reef-scenario": "agent"}, timeout=60,
                            json={"score": 0.75, "episode": "run-1", "feedback": "called the tool, then answered",
                                  "context": "Call get_weather once, then answer in one line."})
        assert rep.status_code == 200, rep.text
        lone = requests.post(f"{r.url}/v1/chat/completions", headers={"x-reef-scenario": "agent"}, timeout=60,
                             json={"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert lone.status_code == 200 and "x-reef-episode" not in lone.headers, lone.text
        alone = lone.headers[RECEIPT_HEADER]
    finally:
        r.stop()
    monkeypatch.setenv("REEF_LAB_DATA_DIR", str(d))
    return d, got["records"], rep.json()["agent_record_id"], alone


def turns_of(text: str) -> list[str]:
    block = text[text.index("id='records-episode'"):]
    return block.split("<div class='episode-turn'")[1:]


def test_records_app_shows_an_episode_as_a_conversation(episode_data):
    from tests.test_episodes import TOOL_RESULT

    d, (first, second), report_id, alone = episode_data
    records = load_module("records")
    outputs, env = records.app.run(defs={"selected_id": second["id"]})  # a record of the episode, inspected
    assert env["episode_shown"] == ("agent", "run-1")
    one, two = turns_of(shown(outputs))
    # turn 1: the user's question given, the tool call with its arguments generated and trained
    assert "<b>turn 1</b>" in one and first["id"] in one and "Weather in Paris?" in one.split("episode-trained")[0]
    assert 'get_weather({&quot;city&quot;:&quot;Paris&quot;})' in one.split("episode-trained")[1]
    # turn 2: the tool result given (not trained), the answer generated
    given2, trained2 = two.split("episode-trained")
    assert TOOL_RESULT in given2 and "tool (result of" in given2 and TOOL_RESULT not in trained2
    assert "Weather in Paris?" not in two  # only what the turn's request added
    # the token counts are the learner's: turn 1's prompt, then what turn 2's prompt added; generated = trained
    added = len(second["prompt_token_ids"]) - len(first["prompt_token_ids"]) - len(first["token_ids"])
    assert f"{len(first['prompt_token_ids'])} given tokens · {len(first['token_ids'])} generated tokens trained" in one
    assert f"{added} given tokens · {len(second['token_ids'])} generated tokens trained" in two
    trained = len(first["token_ids"]) + len(second["token_ids"])
    assert f"trains one sample of 2 turns: <b>{trained}</b> tokens with loss" in shown(outputs)
    # the report on it: score and feedback
    reports = shown(outputs).split("episode-reports")[1]
    assert report_id in reports and re.search(r">0.75</td>", reports) and "called the tool, then answered" in reports
    assert "Call get_weather once, then answer in one line." in reports  # the teacher context beside the feedback
    outputs, _ = records.app.run(defs={"selected_id": report_id})  # the report inspected: its context shown
    context = shown(outputs).split("report-context")[1]
    assert "the teacher&#x27;s words" in context or "the teacher's words" in context
    assert "Call get_weather once, then answer in one line." in context
    # the picker lists it; a call of no episode shows none until one is picked
    outputs, env = records.app.run(defs={"selected_id": alone})
    assert env["episode_shown"] is None and "belongs to no episode" in shown(outputs)
    assert ("agent", "run-1") in env["episode_select"].options.values()
    outputs, env = records.app.run(defs={"selected_id": alone, "episode_select": mo.ui.dropdown(
        {"ep": ("agent", "run-1")}, value="ep")})
    assert env["episode_shown"] == ("agent", "run-1") and len(turns_of(shown(outputs))) == 2
    # a refused call of the episode shows as not trained; a history the client rewrote is split, said so, and each
    # call's whole prompt is given
    from apps.conversation import episode_html, trained_tokens

    refused = {**second, "id": "rec_refused", "status": "refused", "error": "max_tokens must be positive",
               "token_ids": None, "created_at": second["created_at"] + 1}
    html3 = episode_html("run-1", "agent", [first, second, refused], [])
    assert "3 turns" in html3 and "1 calls not trained" in html3
    assert "not trained (refused: max_tokens must be positive)" in html3.split("<b>turn 3</b>")[1]
    drifted = {**second, "prompt_token_ids": second["prompt_token_ids"][:3] + [0] + second["prompt_token_ids"][4:]}
    tokens = trained_tokens([first, drifted])
    assert tokens["how"].startswith("one sample per call (a turn's prompt does not extend")
    assert tokens["per"][second["id"]] == {"given": len(second["prompt_token_ids"]),
                                           "generated": len(second["token_ids"])}
    assert tokens["samples"] == 2 and tokens["trained"] == trained


def test_sao_app_plots_retention_beside_the_held_out_accuracy(tmp_path):
    """Issue 39: a release's score on the retention task (a second task it was not trained on) is drawn on the same
    panel as its held-out accuracy, base at step 0, each with its interval."""
    sao = load_module("sao")
    folder = sao_run(tmp_path / "run", [{"trainer_step": 2, "reward_mean": 0.3}])
    metrics = folder / "data" / "learn" / "x" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows.insert(1, {"event": "eval", "release_id": "base", "retention_accuracy": 0.75, "time": rows[0]["time"]})
    for r in rows:
        if r["event"] == "candidate":
            r["retention_accuracy"] = 0.5
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = sao.load_run(folder)
    assert sao.accuracy_points(run, "retention")[:2] == ([0.0, 2], [0.75, 0.5])
    assert sao.accuracy_points(run)[:2] == ([0.0, 2], [0.25, 0.5])
    fig = sao.plot_run(run)
    ax = next(a for a in fig.axes if a.get_title().startswith("held-out and retention"))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["held-out", "retention"]
    assert axis_problems(fig) == []
