"""A GEPA experiment end to end on the loopback stub as task and reflection model, then apps/gepa.py reading it.

The stub answers "Calculate ..." questions wrongly unless the system text holds REEF-SOLVE, and rewrites any
instruction file into one that holds it; so the seed harness scores 0, the first kept mutation scores 1 everywhere.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from recipes.gepa.experiment import GEPAExperimentConfig, make_splits, run_gepa_experiment
from reef_lab.tasks.base import make_task, score_item

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, stub_url, **kw):
    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    return GEPAExperimentConfig(**{"name": "calc", "task": {"name": "arithmetic"}, "train_size": 6, "val_size": 4,
                                   "test_size": 8, "task_lm": lm, "reflection_lm": lm, "out_dir": str(tmp_path / "r"),
                                   "search": {"max_metric_calls": 40, "minibatch_size": 3}, **kw})


def test_gepa_experiment_evolves_publishes_and_tests(tmp_path, stub_url, monkeypatch):
    cfg = config(tmp_path, stub_url)
    s = run_gepa_experiment(cfg, progress=False)
    assert s["seed_val"] == 0.0 and s["best_val"] == 1.0 and s["seed_test"] == 0.0 and s["best_test"] == 1.0
    assert "REEF-SOLVE" in s["best_harness"]["rules.md"] and s["serving"] == "calc:v2"
    # seed on 4 validation items; the first mutation on 3 + 3 minibatch rollouts, then 4 validation; the kept
    # child is perfect on every later minibatch, so reflection is skipped and no call is spent after that
    assert s["metric_calls"] <= 4 + 3 + 3 + 4 + 6 + 6 + 4
    answers = [json.loads(x) for x in (Path(cfg.out_dir) / "test_answers.jsonl").read_text().splitlines()]
    assert len(answers) == 16 and {a["candidate"] for a in answers} == {"seed", "best"}
    # resuming a finished run spends nothing more and finds the same best
    again = run_gepa_experiment(cfg, progress=False)
    assert again["metric_calls"] == s["metric_calls"] and again["best_harness"] == s["best_harness"]

    spec = importlib.util.spec_from_file_location("gepa_app", ROOT / "apps" / "gepa.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    search = mod.load_search(cfg.out_dir)
    assert search["candidates"].height == 2 and search["candidates"]["val_mean"].to_list() == [0.0, 1.0]
    assert "+REEF-SOLVE" in mod.diff_to_parent(search, 1) and mod.diff_to_parent(search, 0) == ""
    assert "c0 --> c1" in mod.tree_mermaid(search)
    assert search["fronts"][-1]["front"] == {"1": 4}
    assert len(mod.plot_search(search).axes) == 2
    monkeypatch.setenv("REEF_LAB_RUN", str(cfg.out_dir))  # the whole app, headless, pointed at the search
    _, env = mod.app.run()
    assert env["run_ui"].value == str(cfg.out_dir) and env["search"]["candidates"].height == 2
    assert cfg.out_dir in mod.find_searches(tmp_path)


def test_splits_are_disjoint_and_fixed_by_the_data_seed():
    task = make_task({"name": "arithmetic", "system_prompt": ""})
    train, val, test = make_splits(task, 20, 10, 30, seed=5)
    qs = [[it["messages"][-1]["content"] for it in split] for split in (train, val, test)]
    assert len(set(qs[0]) | set(qs[1]) | set(qs[2])) == 60
    assert make_splits(task, 20, 10, 30, seed=5)[2] == test


def test_bad_gepa_experiment_config_says_what_to_fix():
    with pytest.raises(ValueError, match="at least 1"):
        GEPAExperimentConfig(search={"minibatch_size": 0})
    with pytest.raises(TypeError):
        GEPAExperimentConfig(search={"budget": 3})


def test_task_and_reflection_models_can_differ(tmp_path, stub_url, tiny_model_dir):
    """The embedded engine answers the tasks; the stub (an OpenAI-compatible endpoint) reflects."""
    from reef_lab.engines.embedded import EmbeddedEngine
    from recipes.gepa.search import read_events
    from reef_lab.testing.stub_provider import IMPROVED_INSTRUCTION

    engine = EmbeddedEngine.from_path(str(tiny_model_dir))
    try:
        cfg = config(tmp_path, stub_url, task_lm={"kind": "engine"}, task_max_tokens=4,
                     reflection_lm={"kind": "openai", "base_url": stub_url, "model": "stub-model",
                                    "record": str(tmp_path / "reflection.jsonl")},
                     search={"max_metric_calls": 12, "minibatch_size": 2})
        s = run_gepa_experiment(cfg, engine=engine, progress=False)
    finally:
        engine.close()
    proposals = [e["proposal"] for e in read_events(cfg.out_dir) if e.get("proposal")]
    assert proposals and set(proposals) == {IMPROVED_INSTRUCTION}  # reflection came from the stub
    calls = [json.loads(x) for x in (tmp_path / "reflection.jsonl").read_text().splitlines()]
    assert len(calls) == len(proposals) and all("Write a new version of" in c["messages"][0]["content"] for c in calls)
    assert s["metric_calls"] >= 12 and s["serving"] == "calc:v1"  # the random tiny model never answers right


def test_answer_format_verifier_and_its_feedback():
    from recipes.gepa.search import verifier_feedback

    item = make_task({"name": "arithmetic", "answer_format": "Answer: {answer}"}).items(1, seed=1)[0]
    assert item["answer"] == "2"
    assert verifier_feedback(item, "Answer: 2") == (1.0, "Correct: the answer 2 is the expected answer.")
    score, text = verifier_feedback(item, "5 - 3 = 2")
    assert score == 0.0 and "must be written as 'Answer: <number>' (here: 'Answer: 2')" in text
    assert verifier_feedback(item, "Answer: 3\nso Answer: 2")[0] == 1.0  # the last one written counts
    with pytest.raises(ValueError, match="exactly once"):
        make_task({"answer_format": "Answer"})


def test_multiple_choice_task_reads_the_label_the_reply_starts_with(tmp_path):
    from recipes.gepa.search import verifier_feedback

    rows = [{"question": "Which is a mammal?", "answerKey": "B",
             "choices": {"text": ["trout", "whale", "frog"], "label": ["A", "B", "C"]}},
            {"question": "2 + 2?", "choices": ["3", "4"], "answerKey": "1"}]  # plain options, index answer
    path = tmp_path / "mc.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = make_task({"name": "choice", "path": str(path), "answer_field": "answerKey", "system_prompt": ""})
    items = {it["messages"][0]["content"].split("\n")[0]: it for it in task.items(2, seed=0)}
    mc = items["Which is a mammal?"]
    assert mc["messages"][0]["content"] == "Which is a mammal?\n\nA. trout\nB. whale\nC. frog"
    assert mc["answer"] == "B" and mc["choices"] == ["A", "B", "C"]
    assert items["2 + 2?"]["answer"] == "B"
    for reply in ("B", "B. whale", " (B) whale", "b) whale", "B: whale"):
        assert score_item(mc, reply) == 1.0, reply
    for reply in ("The answer is B.", "A", "Bwhale", "D", "whale"):
        assert score_item(mc, reply) == 0.0, reply
    assert verifier_feedback(mc, "B. whale") == (1.0, "Correct: the reply starts with the expected option B.")
    assert verifier_feedback(mc, "A. trout") == (0.0, "Incorrect: the reply chose A, but the expected answer is B.")
    score, text = verifier_feedback(mc, "The answer is B.")
    assert score == 0.0 and "must start with the label of the chosen option (A, B or C)" in text
    with pytest.raises(ValueError, match="not installed"):
        make_task({"name": "choice", "path": "pkg:no_such_package_xyz/data"}).items(1, seed=0)


def test_oe_eval_multiple_choice_requests_and_splits_disjoint_by_question(tmp_path):
    """OLMo eval suite requests (a `doc` with the options inside its query, e.g. copycolors) become choice items; a
    question asked with several option orders stays inside one split."""
    import gzip

    def doc(i: int, colours: list[str], gold: int) -> dict:
        q = f"Question: Thing {i} is {colours[gold]}. What color is thing {i}?\n" + "".join(
            f" {chr(65 + k)}. {c}\n" for k, c in enumerate(colours)) + "Answer:"
        return {"request_type": "loglikelihood", "doc": {"id": i, "query": q, "gold": gold,
                                                         "choices": [chr(65 + k) for k in range(len(colours))]}}
    lines = [doc(i, order, order.index(["red", "blue", "green"][i % 3]))
             for i in range(12) for order in (["red", "blue", "green"], ["green", "red", "blue"])]
    path = tmp_path / "requests.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(json.dumps(x) for x in lines).encode()))
    task = make_task({"name": "choice", "path": str(path), "system_prompt": ""})
    items = task.items(24, seed=0)
    first = next(it for it in items if it["key"] == "Thing 0 is red. What color is thing 0?"
                 and it["messages"][0]["content"].endswith("C. green"))
    assert first["messages"][0]["content"] == ("Thing 0 is red. What color is thing 0?\n\nA. red\nB. blue\nC. green")
    assert first["answer"] == "A" and first["choices"] == ["A", "B", "C"]
    assert all(score_item(it, it["answer"]) == 1.0 for it in items)
    train, val, test = make_splits(task, 6, 4, 6, seed=3)
    keys = [{it["key"] for it in split} for split in (train, val, test)]
    assert not keys[0] & keys[1] and not keys[0] & keys[2] and not keys[1] & keys[2]
    with pytest.raises(ValueError, match="no lettered options"):
        from reef_lab.tasks.base import oe_eval_choice_row
        oe_eval_choice_row({"query": "What?", "choices": ["A"], "gold": 0})


def test_open_choice_reads_the_option_the_reply_names_first(tmp_path):
    from recipes.gepa.search import verifier_feedback

    rows = [{"question": "Snow is white. What color is snow?", "answer": "B",
             "choices": {"text": ["black", "white", "grey"], "label": ["A", "B", "C"]}}]
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps(rows[0]))
    item = make_task({"name": "choice", "path": str(path), "show_options": False, "system_prompt": ""}).items(1, 0)[0]
    assert item["messages"][0]["content"] == "Snow is white. What color is snow?"
    for reply in ("Snow is white.", "WHITE", "white, not grey", "A snowman is white."):
        assert score_item(item, reply) == 1.0, reply
    for reply in ("Snow is grey, not white.", "B", "whitish", "It is cold."):
        assert score_item(item, reply) == 0.0, reply
    assert verifier_feedback(item, "Snow is white.") == (1.0, "Correct: the reply names 'white', the expected answer.")
    assert verifier_feedback(item, "It is grey and white.")[1].startswith(
        "Incorrect: the reply names 'grey' first, but the expected answer is 'white'.")
    assert "names none of the options" in verifier_feedback(item, "It is cold.")[1]
