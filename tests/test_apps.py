"""The marimo apps run headless (in-process, `app.run()`) over a small data dir and compute the right tables."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import orjson
import pytest

from reef_lab.records.record import Record
from reef_lab.records.store import RecordStore

APP_PATH = Path(__file__).resolve().parents[1] / "apps" / "records.py"
T0 = time.time() - 3600  # records an hour old; scenarios registered before them


def load_module(name: str = "records"):
    """apps/<name>.py as a module (its marimo `app` and its functions)."""
    spec = importlib.util.spec_from_file_location(f"reef_{name}_app", APP_PATH.parent / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_app():
    return load_module("records").app


def chat(user: str, answer: str | None):
    req = {"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": user}]}
    resp = None if answer is None else {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    return req, resp


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "data"
    store = RecordStore(d)
    recs = []

    def inf(rid, scenario, dt, user, answer, **kw):
        req, resp = chat(user, answer)
        recs.append(Record(id=rid, scenario=scenario, kind="inference", dialect="openai.chat", created_at=T0 + dt,
                           request=req, response=resp, timing={"total_ms": 12.5 + dt}, tags={"user": "u1"}, **kw))

    inf("a1", "alpha", 1, "What is a reef?", "A ridge of coral.", token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3],
        release_id="rel-1")
    inf("a2", "alpha", 2, "Tell me about the needle in the haystack " + "x" * 200, "Here it is.",
        token_ids=[4, 5], logprobs=[-1.0, -2.0], release_id="rel-1")
    inf("a3", "alpha", 3, "This one fails", None, status="error", error="upstream answered HTTP 500")
    recs.append(Record(id="a4", scenario="alpha", kind="inference", dialect="anthropic.messages", created_at=T0 + 4,
                       request={"model": "m", "max_tokens": 10, "messages": [
                           {"role": "user", "content": [{"type": "text", "text": "Hi from anthropic"}]}]},
                       response={"type": "message", "role": "assistant",
                                 "content": [{"type": "text", "text": "Hello back"}],
                                 "usage": {"input_tokens": 3, "output_tokens": 2}}))
    inf("b1", "beta", 5, "Beta question", "Beta answer", token_ids=[9], logprobs=[-0.5])
    inf("g1", "gone", 6, "From a deleted scenario", "ghost")  # not in scenarios.json: hidden by default
    store.append(recs)
    store.append([
        Record(id="r1", scenario="alpha", kind="report", created_at=T0 + 10, score=1.0, references=["a1"]),
        Record(id="r2", scenario="alpha", kind="report", created_at=T0 + 11, score=0.0, references=["a1", "a2"],
               feedback="wrong about the reef"),
        Record(id="r3", scenario="alpha", kind="report", created_at=T0 + 12, score=1.0, references=["a2"],
               feedback={"comment": "great"}),
        Record(id="r4", scenario="beta", kind="report", created_at=T0 + 13, score=0.5, references=["b1"]),
    ])
    store.close()  # rolls into a Parquet segment; the first log of a second store stays a log (both paths read)
    store = RecordStore(d)
    inf("b2", "beta", 20, "Beta again", "Still beta")
    store.append(recs[-1:])
    (d / "scenarios.json").write_bytes(orjson.dumps([
        {"name": "alpha", "recipe": "basic", "created_at": T0 - 100, "config": {}},
        {"name": "beta", "recipe": "grpo", "created_at": T0 - 50, "config": {}},
        {"name": "empty", "recipe": "basic", "created_at": T0 - 10, "config": {}},
    ]))
    monkeypatch.setenv("REEF_LAB_DATA_DIR", str(d))
    yield d
    store.close()


def run(app, **defs):
    outputs, env = app.run(defs=defs or None)
    return env


def test_records_app_tables(data_dir):
    app = load_app()
    env = run(app)
    assert env["load_error"] is None
    assert env["hidden_count"] == 1

    sc = {r["scenario"]: r for r in env["scenario_table"].iter_rows(named=True)}
    assert set(sc) == {"alpha", "beta", "empty"}  # "gone" is hidden
    assert (sc["alpha"]["inferences"], sc["alpha"]["reports"], sc["alpha"]["errors"]) == (4, 3, 1)
    assert sc["alpha"]["mean_score"] == pytest.approx(2 / 3, abs=1e-3)
    assert (sc["beta"]["inferences"], sc["beta"]["reports"], sc["beta"]["mean_score"]) == (2, 1, 0.5)
    assert sc["beta"]["recipe"] == "grpo"
    assert (sc["empty"]["inferences"], sc["empty"]["reports"], sc["empty"]["mean_score"]) == (0, 0, None)

    # default filters: every visible record, newest first
    f = env["filtered"]
    assert f["id"].to_list() == ["b2", "r4", "r3", "r2", "r1", "b1", "a4", "a3", "a2", "a1"]
    view = {r["id"]: r for r in env["records_view"].iter_rows(named=True)}
    assert view["a1"]["user"] == "What is a reef?" and view["a1"]["answer"] == "A ridge of coral."
    assert (view["a1"]["tokens"], view["a1"]["latency_ms"], view["a1"]["release_id"]) == (3, 13.5, "rel-1")
    assert len(view["a2"]["user"]) == 80 and view["a2"]["user"].endswith("…")
    assert view["a3"]["status"] == "error" and view["a3"]["answer"] == "[error] upstream answered HTTP 500"
    assert view["a4"]["user"] == "Hi from anthropic" and view["a4"]["answer"] == "Hello back"
    assert view["a4"]["tokens"] == 2  # from the response's usage when there are no token ids

    hist = dict(env["score_hist"].select("bin", "count").iter_rows())
    assert hist == {"0.0": 1, "0.5": 1, "1.0": 2}
    assert env["inspected"] is None  # nothing selected

    # filters (the cell that reads the widgets is replaced by a plain dict)
    base = env["flt"]

    def ids(**kw):
        return set(run(app, flt={**base, **kw})["filtered"]["id"].to_list())

    assert ids(scenario="alpha", kinds=["inference"]) == {"a1", "a2", "a3", "a4"}
    assert ids(status="error") == {"a3"}
    assert ids(status="ok", kinds=["report"], scenario="beta") == {"r4"}
    assert ids(search="NEEDLE") == {"a2"}
    assert ids(search="wrong about") == {"r2"}  # feedback is searched too
    assert ids(time_mode="last N records", n=3) == {"b2", "r4", "r3"}
    assert ids(time_mode="last N minutes", n=5) == set()
    assert len(ids(time_mode="last N hours", n=2)) == 10
    assert "g1" in ids(include_hidden=True)
    e = run(app, flt={**base, "kinds": ["report"], "scenario": "alpha"})
    assert dict(e["score_hist"].select("bin", "count").iter_rows()) == {"0.0": 1, "1.0": 2}


def test_records_app_inspect(data_dir):
    app = load_app()
    e = run(app, selected_id="r2")
    assert e["inspected"]["kind"] == "report" and e["inspected"]["score"] == 0.0
    assert e["inspected"]["feedback"] == "wrong about the reef"
    ref = {r["id"]: r for r in e["referenced_df"].iter_rows(named=True)}
    assert set(ref) == {"a1", "a2"} and ref["a1"]["answer"] == "A ridge of coral."

    e = run(app, selected_id="a1")
    assert e["inspected"]["request"]["messages"][-1]["content"] == "What is a reef?"
    assert e["inspected"]["mean_logprob"] == pytest.approx(-0.2)
    assert set(e["referencing_df"]["id"].to_list()) == {"r1", "r2"}

    e = run(app, selected_id="nope")
    assert e["inspected"] is None


@pytest.mark.parametrize("make", [False, True])
def test_records_app_empty_or_missing_dir(tmp_path, monkeypatch, make):
    d = tmp_path / "nothing"
    if make:
        d.mkdir()
    monkeypatch.setenv("REEF_LAB_DATA_DIR", str(d))
    outputs, env = load_app().run()
    assert env["load_error"] is None
    shown = " ".join(getattr(o, "text", "") for o in outputs)
    assert ("has no scenarios or records yet" if make else "No data dir at") in shown
    assert "Traceback" not in shown
    assert env["records"].height == 0 and env["filtered"].height == 0
    assert env["scenario_table"].height == 0 and env["score_hist"].height == 0


def test_launch_detached_runs_the_experiment_script_with_its_log(tmp_path):
    """The apps' launch path: scripts/run_experiment.py as a detached child, output in <out>/run.log. A config
    file that does not exist makes the child fail at once, with the script's own message in the log."""
    from apps.launch import launch_detached

    out = tmp_path / "run"
    proc = launch_detached(tmp_path / "missing.yaml", 3, out, {"search.max_metric_calls": 20})
    assert proc.wait(timeout=120) != 0
    log = (out / "run.log").read_text()
    assert "missing.yaml" in log, log[-2000:]
    assert proc.args[-6:] == ["--seed", "3", "--out", str(out), "--set", "search.max_metric_calls=20"]


def test_experiment_apps_wait_for_a_folder_with_no_run_yet(tmp_path, monkeypatch):
    """A just-launched run has no files yet (or the path is wrong): each app says so instead of failing."""
    folder = str(tmp_path / "not-yet")
    monkeypatch.setenv("REEF_LAB_RUN", folder)
    _, env = load_module("sao").app.run()
    assert env["run_ui"].value == folder and env["run"] is None
    _, env = load_module("gepa").app.run()
    assert env["run_ui"].value == folder and env["search"]["cands"] == {}


def test_records_app_joins_reports_to_answers_and_filters_by_release(data_dir):
    """An inference shows the mean score, count and feedback of the reports on it; a report its own feedback and the
    release of what it reports on; the Release filter keeps what a release served and the reports on it."""
    app = load_app()
    env = run(app)
    view = {r["id"]: r for r in env["records_view"].iter_rows(named=True)}
    assert (view["a1"]["score"], view["a1"]["reports"]) == (0.5, 2)  # r1 1.0 and r2 0.0
    assert view["a1"]["feedback"] == "wrong about the reef"
    assert (view["a2"]["score"], view["a2"]["reports"]) == (0.5, 2)  # r2 0.0 and r3 1.0
    assert view["a3"]["score"] is None and view["a3"]["reports"] is None
    assert view["r2"]["feedback"] == "wrong about the reef" and view["r3"]["feedback"] == '{"comment":"great"}'
    assert view["r1"]["release_id"] == "rel-1" and view["r4"]["release_id"] is None
    assert env["release_names"] == ["rel-1"]
    ids = set(run(app, flt={**env["flt"], "release": "rel-1"})["filtered"]["id"].to_list())
    assert ids == {"a1", "a2", "r1", "r2", "r3"}


def test_sao_app_default_launch_is_the_published_config(tmp_path, monkeypatch):
    """The launch form's defaults add no override: the command is the one behind results/sao-arithmetic.md (its
    config file, its first seed), so the run's config is the published one's."""
    import re
    from dataclasses import asdict

    import yaml

    from reef_lab.experiments.weights import ExperimentConfig

    monkeypatch.setenv("REEF_LAB_RUNS", str(tmp_path))
    _, env = load_module("sao").app.run()
    page = (APP_PATH.parents[1] / "results" / "sao-arithmetic.md").read_text()
    example, seeds = re.search(r"compare_recipes\.py (\S+\.yaml).*?--seeds (\d+)", page).groups()
    assert env["example_ui"].value == example and env["overrides"] == {}
    assert f"scripts/run_experiment.py {example} --seed {seeds} --out " in env["launch_cmd"]
    assert "--set" not in env["launch_cmd"] and env["launch_dir"].name == f"sao-arithmetic-seed{seeds}"
    data = yaml.safe_load((APP_PATH.parents[1] / example).read_text())
    assert data["recipe_config"]["trainer"]["lr"] == 3e-5
    assert float(env["lr_ui"].value) == 3e-5 and int(env["rollouts_ui"].value) == data["rollouts"]
    # what scripts/run_experiment.py builds from that command: the page's config
    assert asdict(ExperimentConfig(**{**data, "seed": int(seeds)}))["recipe_config"]["trainer"]["lr"] == 3e-5


def test_shared_statistics_and_tables():
    from apps.shared import mean_ci, tidy, wilson
    from reef_lab.experiments.stats import t95

    assert mean_ci([0.094, 0.141, 0.141]) == pytest.approx((0.1253, 0.0674), abs=1e-3)  # results/sao-arithmetic.md
    assert mean_ci([0.5]) == (0.5, 0.0) and t95(2) == 12.706 and t95(100) == 1.96
    lo, hi = wilson(0, 8)
    assert lo == 0.0 and hi == pytest.approx(0.324, abs=1e-3)
    import polars as pl

    shown = tidy(pl.DataFrame({"time": [1796172972.6628623], "loss": [0.123456789123], "n": [3]}))
    assert shown.row(0) == ("2026-12-02 00:56:12", 0.1235, 3)
