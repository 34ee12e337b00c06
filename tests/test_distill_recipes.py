"""The distillation recipes live (recipes/opd): a teacher named by the operator, checked when the learner starts,
scoring the student's own served tokens; a release out and served. On the tiny random-init Llama."""

from __future__ import annotations

import json
import math
import shutil

import openai
import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.errors import BadRequest
from reef_lab.learning.learner import read_metrics
from reef_lab.tasks.base import make_task
from reef_lab.trainers.samples import Sample
from tests.conftest import Running
from tests.test_learning import EVAL, TRAINER, ask, check_trained, drive, gateway  # noqa: F401 - the fixture




def teacher_release(gw) -> str:
    """A weights release of another scenario (SFT on half the answers): the teacher the OPD scenario names."""
    gw.create_scenario({"name": "teach", "recipe": "sft", "config": {"batch_size": 4, "trainer": TRAINER}})
    drive(gw, "teach", 8)
    ln = gw.learner("teach")
    assert ln.wait_idle(300) and ln.last_error is None, ln.status()
    assert gw.list_releases("teach")["serving"] == "teach:v1"
    return "teach:v1"


def unscored(gw, scenario: str, n: int) -> None:
    """n answers at temperature 1, each reported without a score (OPD needs none)."""
    for k, item in enumerate(make_task().items(n, seed=5)):
        receipt, _, _ = ask(gw, scenario, item, seed=k)
        gw.report(scenario, {"references": [receipt], "feedback": "no score here"})


def test_opd_distils_a_release_of_another_scenario_into_the_student(gateway, tiny_model_dir):
    teacher = teacher_release(gateway)
    gateway.create_scenario({"name": "s", "recipe": "opd", "config": {
        "teacher": {"release": teacher}, "batch_size": 4, "steps_per_candidate": 2, "trainer": TRAINER,
        **EVAL}}, operator=True)
    unscored(gateway, "s", 8)
    check_trained(gateway, "s", tiny_model_dir)  # every parameter moved, v1 released and serving
    steps = [m for m in read_metrics(gateway.learner("s").metrics_path) if m["event"] == "step"]
    assert len(steps) == 2 and all(m["policy_step"] for m in steps)
    for m in steps:
        # the teacher differs from the student: a nonzero gap and a finite divergence estimate on 4 samples' tokens
        assert math.isfinite(m["reverse_kl"]) and m["teacher_gap"] != 0 and m["samples"] == 4
        assert "reward_mean" not in m  # no report carried a score
    # the other scenario still serves its own release; the teacher was not changed by being read
    assert ask(gateway, "teach", make_task().items(1, seed=99)[0])[1] == "teach:v1"


def test_opd_forward_kl_over_the_teachers_top_k(gateway, tiny_model_dir):
    teacher = teacher_release(gateway)
    gateway.create_scenario({"name": "s", "recipe": "opd", "config": {
        "teacher": {"release": teacher}, "divergence": "forward_kl", "top_k": 4, "batch_size": 4,
        "trainer": TRAINER, **EVAL}}, operator=True)
    unscored(gateway, "s", 4)
    ln = gateway.learner("s")
    assert ln.wait_idle(300) and ln.last_error is None, ln.status()
    (step,) = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
    assert step["forward_kl"] > 0 and math.isfinite(step["loss"])


def test_opd_config_errors_are_400s_naming_the_field(gateway, tiny_model_dir, tmp_path):
    running = Running(gateway)
    try:
        def create(config):
            return requests.post(f"{running.url}/reef/scenarios", json={"name": "s", "recipe": "opd",
                                                                        "config": config}, timeout=60)
        r = create({"teacher": {"release": "teach:v1"}})  # a client may not point a scenario at weights
        assert r.status_code == 400 and "teacher" in r.json()["error"]["message"], r.text
        assert requests.get(f"{running.url}/reef/scenarios", timeout=30).json()["scenarios"] == []
    finally:
        running.server.shutdown()
    with pytest.raises(BadRequest, match="divergence must be one of"):
        gateway.create_scenario({"name": "s", "recipe": "opd", "config": {
            "teacher": {"release": "x:v1"}, "divergence": "kl"}}, operator=True)
    with pytest.raises(BadRequest, match="top_k"):
        gateway.create_scenario({"name": "s", "recipe": "opd", "config": {
            "teacher": {"release": "x:v1"}, "divergence": "jsd", "top_k": 0}}, operator=True)
    with pytest.raises(BadRequest, match="no config.json"):
        gateway.create_scenario({"name": "s", "recipe": "opd", "config": {
            "teacher": {"model_path": str(tmp_path)}}}, operator=True)
    with pytest.raises(BadRequest, match="'<scenario>:vN'"):
        gateway.create_scenario({"name": "s", "recipe": "opd", "config": {"teacher": {"release": "v1"}}},
                                operator=True)


def test_opd_refuses_a_missing_teacher_one_of_another_tokenizer_or_a_missing_release(gateway, tiny_model_dir, tmp_path):
    """Checked when the learner starts (the first report): the scenario keeps serving and recording, the error
    names the fix in /reef/status; nothing is re-tokenised."""
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    vocab = json.loads((other / "tokenizer.json").read_text())
    vocab["model"]["vocab"] = {("x" + k if i == 7 else k): v for i, (k, v) in enumerate(vocab["model"]["vocab"].items())}
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    gateway.create_scenario({"name": "a", "recipe": "opd", "config": {"teacher": {"model_path": str(other)}}},
                            operator=True)
    gateway.create_scenario({"name": "b", "recipe": "opd", "config": {"teacher": {"release": "nowhere:v1"}}},
                            operator=True)
    gateway.create_scenario({"name": "c", "recipe": "opd", "config": {"batch_size": 4}})  # a client's: no teacher
    for name in ("a", "b", "c"):
        receipt, release, _ = ask(gateway, name, make_task().items(1, seed=1)[0])
        assert release == "base"
        gateway.report(name, {"references": [receipt], "feedback": "ok"})
        assert gateway.get_record(name, receipt)["release_id"] == "base"  # recorded all the same
    errors = gateway.learners.errors
    assert "another tokenizer than the student" in errors["a"], errors
    assert "no scenario 'nowhere'" in errors["b"], errors
    assert "names none: set teacher.release" in errors["c"], errors


def test_opd_live_over_http_with_the_openai_sdk(gateway, tiny_model_dir):
    """The SDK client's answers, reported without scores over HTTP, train a release that serves the next call
    without a restart."""
    teacher = teacher_release(gateway)
    gateway.create_scenario({"name": "s", "recipe": "opd", "config": {
        "teacher": {"release": teacher}, "batch_size": 4, "trainer": TRAINER}}, operator=True)
    running = Running(gateway)
    try:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="none",
                               default_headers={"x-reef-scenario": "s"})
        for k, item in enumerate(make_task().items(4, seed=3)):
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=item["messages"], max_tokens=6, temperature=1.0, seed=k)
            receipt = raw.headers["x-reef-agent-record-id"]
            r = requests.post(f"{running.url}/reef/report", headers={"x-reef-scenario": "s"},
                              json={"references": [receipt], "feedback": "looks fine"}, timeout=60)
            assert r.status_code in (200, 201), r.text
        ln = gateway.learner("s")
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=make_task().items(1, seed=9)[0]["messages"], max_tokens=4)
        assert raw.headers["x-reef-release-id"] == "s:v1"
    finally:
        running.server.shutdown()


def test_the_shipped_examples_configure():
    from pathlib import Path

    import yaml

    from reef_lab.learning.recipe import load_recipe

    for recipe_name in ("opd", "sdft", "sdpo"):
        for name in ("arithmetic", "tiny"):
            path = Path(__file__).resolve().parents[1] / f"recipes/{recipe_name}/examples/{name}.yaml"
            recipe = load_recipe(recipe_name, yaml.safe_load(path.read_text()))
            assert recipe.config.batch_size >= 4
            assert recipe_name != "opd" or recipe.config.teacher.release
    from reef_lab.experiments.weights import ExperimentConfig

    root = Path(__file__).resolve().parents[1]
    sao = ExperimentConfig.parse(yaml.safe_load((root / "recipes/sao/examples/arithmetic.yaml").read_text()))
    divergences = {}
    for name in ("arithmetic-experiment", "arithmetic-topk-experiment"):
        exp = ExperimentConfig.parse(yaml.safe_load((root / f"recipes/sdft/examples/{name}.yaml").read_text()))
        assert exp.recipe == "sdft" and "{answer}" in exp.report_context
        for k in ("rollouts", "max_tokens", "temperature", "task"):  # equal budgets with the SAO run it is compared to
            assert getattr(exp, k) == getattr(sao, k), (name, k)
        for k in ("batch_size", "steps_per_candidate", "eval_task", "eval_size", "trainer"):
            assert exp.recipe_config[k] == sao.recipe_config[k], (name, k)
        divergences[name] = load_recipe("sdft", exp.recipe_config).config.divergence
    assert divergences == {"arithmetic-experiment": "reverse_kl", "arithmetic-topk-experiment": "forward_kl"}
    ctxd = ExperimentConfig.parse(yaml.safe_load((root / "recipes/ctxd/examples/colors-experiment.yaml").read_text()))
    assert ctxd.recipe == "ctxd" and ctxd.harness["system_prompt.md"] and ctxd.task.name == "colors"
    assert load_recipe("ctxd", ctxd.recipe_config).config.retention_task.name != "colors"  # not the trained task


def test_sdft_learns_from_the_words_of_reports(gateway, tiny_model_dir):
    """The student itself, shown the report's feedback in its system prompt, teaches the student without it: the
    release is trained and served; a report without words, or with too many, is a 400 and stores nothing. The
    teacher is an EMA of the policy's weights (teacher_ema); a decay outside [0, 1) is a 400."""
    from reef_lab.errors import BadRequest

    with pytest.raises(BadRequest, match="teacher_ema"):
        gateway.create_scenario({"name": "bad", "recipe": "sdft", "config": {"teacher_ema": 1.0}})
    gateway.create_scenario({"name": "s", "recipe": "sdft", "config": {
        "batch_size": 4, "steps_per_candidate": 2, "max_context_chars": 200, "teacher_ema": 0.5, "trainer": TRAINER,
        **EVAL}})
    items = make_task().items(8, seed=5)
    receipts = []
    for k, item in enumerate(items):
        receipt, _, _ = ask(gateway, "s", item, seed=k)
        receipts.append(receipt)
        with pytest.raises(BadRequest, match="learns from the words of a report"):
            gateway.report("s", {"references": [receipt], "score": 1.0})
        with pytest.raises(BadRequest, match="at most 200"):
            gateway.report("s", {"references": [receipt], "feedback": "x" * 201})
        with pytest.raises(BadRequest, match="at most 200"):
            gateway.report("s", {"references": [receipt], "context": "y" * 201, "feedback": "short"})
        # the words as the report's `context` field, as a feedback string, as a feedback object's context
        words = [{"context": f"The answer is {item['answer']}.", "score": 0.0},
                 {"feedback": f"The answer is {item['answer']}."},
                 {"feedback": {"context": f"It is {item['answer']}.", "by": "t"}}][k % 3]
        gateway.report("s", {"references": [receipt], **words})
    check_trained(gateway, "s", tiny_model_dir)
    steps = [m for m in read_metrics(gateway.learner("s").metrics_path) if m["event"] == "step"]
    assert len(steps) == 2 and all(math.isfinite(m["reverse_kl"]) and m["teacher_gap"] != 0 for m in steps)
    # the refused reports stored nothing: one report per answer, each with its words
    reports = gateway.list_records("s", kind="report", limit=100)["records"]
    assert len(reports) == 8 and all(r["feedback"] or r["context"] for r in reports)
    assert sorted(r["context"] for r in reports if r["context"]) == sorted(
        f"The answer is {item['answer']}." for k, item in enumerate(items) if k % 3 == 0)


def test_sdft_forward_kl_over_the_self_teachers_top_k(gateway, tiny_model_dir):
    """SDFT as the paper runs it (arithmetic-topk-experiment.yaml): the divergence over the top-K tokens of the
    student shown the words, at each position of its own answer; a step trains on it and releases."""
    gateway.create_scenario({"name": "s", "recipe": "sdft", "config": {
        "divergence": "forward_kl", "top_k": 4, "batch_size": 4, "trainer": TRAINER, **EVAL}})
    for k, item in enumerate(make_task().items(4, seed=6)):
        receipt, _, _ = ask(gateway, "s", item, seed=k)
        gateway.report("s", {"references": [receipt], "context": f"The correct answer is {item['answer']}."})
    ln = gateway.learner("s")
    assert ln.wait_idle(300) and ln.last_error is None, ln.status()
    (step,) = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
    assert step["forward_kl"] > 0 and math.isfinite(step["loss"]) and step["samples"] == 4


def test_a_report_carries_its_context_over_http_and_in_imports(gateway):
    """`context` is a report's field: stored, returned, exported with the record; a report may carry only it; a
    context that is not a non-empty string, is too long, or sits on a record that is not a report is a 400."""
    from reef_lab.records.record import MAX_CONTEXT_CHARS

    gateway.create_scenario({"name": "c", "recipe": "sdft", "config": {"batch_size": 100, "trainer": TRAINER}})
    receipt, _, _ = ask(gateway, "c", make_task().items(1, seed=1)[0])
    r = Running(gateway)
    try:
        ok = requests.post(f"{r.url}/reef/report", headers={"x-reef-scenario": "c"}, timeout=60,
                           json={"references": [receipt], "context": "The answer is 12: 5 + 7."})
        assert ok.status_code == 200, ok.text
        got = requests.get(f"{r.url}/reef/scenarios/c/records/{ok.json()['agent_record_id']}", timeout=60).json()
        assert got["context"] == "The answer is 12: 5 + 7." and got["score"] is None and got["feedback"] is None
        for bad, msg in ((7, "'context' must be a non-empty string"), ("  ", "'context' must be a non-empty string"),
                         ("x" * (MAX_CONTEXT_CHARS + 1), f"at most {MAX_CONTEXT_CHARS}")):
            no = requests.post(f"{r.url}/reef/report", headers={"x-reef-scenario": "c"}, timeout=60,
                               json={"references": [receipt], "context": bad})
            assert no.status_code == 400 and msg in no.json()["error"]["message"], no.text
        batch = {"records": [{"id": "imp-r", "scenario": "c", "kind": "report", "references": [receipt],
                              "context": "It is 12."}]}
        assert requests.post(f"{r.url}/reef/records/batch", json=batch, timeout=60).status_code == 201
        wrong = {"records": [{"id": "imp-i", "scenario": "c", "kind": "inference", "context": "It is 12."}]}
        no = requests.post(f"{r.url}/reef/records/batch", json=wrong, timeout=60)
        assert no.status_code == 400 and "'context' is a report's field" in no.json()["error"]["message"], no.text
    finally:
        r.server.shutdown()  # the fixture closes the gateway
    reports = gateway.list_records("c", kind="report", limit=10)["records"]
    assert sorted(x["context"] for x in reports) == ["It is 12.", "The answer is 12: 5 + 7."]


def test_sdft_puts_the_context_in_the_system_message():
    from reef_lab.learning.distill import report_context, with_context

    assert report_context({"feedback": " it is 7 "}) == "it is 7"
    assert report_context({"feedback": {"context": "7"}}) == "7"
    assert report_context({"context": "use 7", "feedback": "wrong"}) == "use 7"  # the field first
    assert report_context({"context": " ", "feedback": "it is 7"}) == "it is 7"
    assert report_context({"feedback": {"text": "7"}}) is None and report_context({"feedback": "  "}) is None
    assert report_context({}) is None
    user = [{"role": "user", "content": "2+5?"}]
    assert with_context(user, "C") == [{"role": "system", "content": "C"}, *user]
    system = [{"role": "system", "content": "Be brief."}, *user]
    assert with_context(system, "C") == [{"role": "system", "content": "Be brief.\n\nC"}, *user]


def test_sdpo_adds_the_self_teachers_token_log_ratio_to_the_group_advantage(gateway, tiny_model_dir):
    """Groups of 2 scored 0 and 1; half the reports carry words: those samples' token advantages are the group
    advantage plus the clipped log-ratio of the student with the words to the rollout; the others' are constant."""
    gateway.create_scenario({"name": "s", "recipe": "sdpo", "config": {
        "group_size": 2, "batch_size": 8, "distill_coef": 0.5, "trainer": TRAINER, **EVAL}})
    seen: list = []
    recipe = gateway.learners.recipe("s")
    train = recipe.train

    def spy(trainer, batch):
        out = train(trainer, batch)
        seen.extend((s.score, s.context, list(s.advantages), s.teacher_logprobs, s.logprobs)
                    for s in batch)
        return out
    recipe.train = spy
    k = 0
    for j, item in enumerate(make_task().items(4, seed=5)):
        for g in range(2):
            receipt, _, _ = ask(gateway, "s", item, seed=k, group=f"p{j}")
            report = {"references": [receipt], "score": float(g)}
            if j % 2:
                report["feedback"] = f"The answer is {item['answer']}."
            gateway.report("s", report)
            k += 1
    with pytest.raises(BadRequest, match="needs a 'score'"):
        gateway.report("s", {"references": [receipt], "feedback": "words alone"})
    check_trained(gateway, "s", tiny_model_dir)
    assert len(seen) == 8
    for score, feedback, advs, teacher, rollout in seen:
        base = 1.0 if score == 1.0 else -1.0  # a group of 0 and 1, centred and scaled by its std
        if feedback is None:
            assert advs == pytest.approx([base] * len(advs), abs=1e-4) and teacher is None
        else:
            want = [base + 0.5 * max(-5, min(5, t - r)) for t, r in zip(teacher, rollout)]
            assert advs == pytest.approx(want, abs=1e-4) and len(set(advs)) > 1
    (step,) = [m for m in read_metrics(gateway.learner("s").metrics_path) if m["event"] == "step"]
    assert step["worded"] == 4 and step["teacher_gap"] != 0


def opd_experiment(tiny_model_dir, tmp_path):
    """An opd experiment through scripts/run_experiment.py's path (reef_lab.experiments.weights.run_experiment): the
    experiment's rollouts, a teacher folder of the same tokenizer (the tiny model with one tensor changed)."""
    import torch
    from safetensors.torch import load_file, save_file

    from reef_lab.experiments.weights import ExperimentConfig, run_experiment

    teacher = tmp_path / "teacher"
    shutil.copytree(tiny_model_dir, teacher)
    tensors = load_file(str(teacher / "model.safetensors"))
    name = next(k for k in tensors if k.endswith("mlp.down_proj.weight"))
    tensors[name] = tensors[name] + 0.05 * torch.randn_like(tensors[name], generator=torch.Generator().manual_seed(0))
    save_file(tensors, str(teacher / "model.safetensors"), metadata={"format": "pt"})
    cfg = ExperimentConfig(name="opd", recipe="opd", rollouts=16, concurrency=4, max_pool=8, max_tokens=4,
                           temperature=1.0, out_dir=str(tmp_path / "run"), recipe_config={
                               "teacher": {"model_path": str(teacher)}, "batch_size": 8, "steps_per_candidate": 2,
                               "trainer": {"lr": 1e-3, "micro_batch_size": 8}})
    return cfg, run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)


def test_opd_runs_as_an_experiment_with_a_teacher_folder(tiny_model_dir, tmp_path):
    cfg, summary = opd_experiment(tiny_model_dir, tmp_path)
    assert summary["releases"] == 1
    steps = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    assert len(steps) == 2 and all(m["samples"] == 8 and m["teacher_gap"] != 0 for m in steps)
    # the weights app opens the run and draws its divergence and teacher gap, per step
    from tests.test_apps import load_module

    sao = load_module("sao")
    run = sao.load_run(cfg.out_dir)
    assert run["distilled"] == ["reverse_kl", "teacher_gap"]
    fig = sao.plot_distill(run)
    drawn = [list(ax.lines[0].get_ydata()) for ax in fig.axes if ax.get_visible()]
    assert drawn == [[m["reverse_kl"] for m in steps], [m["teacher_gap"] for m in steps]]


def test_sdft_runs_as_an_experiment_whose_reports_name_the_answer(tiny_model_dir, tmp_path):
    """An experiment's reports carry `report_context` with each item's answer: sdft learns from those words."""
    from reef_lab.experiments.weights import ExperimentConfig, run_experiment
    from reef_lab.records.store import scan_records

    cfg = ExperimentConfig(name="sdft", recipe="sdft", rollouts=8, concurrency=4, max_pool=4, max_tokens=4,
                           report_context="The correct answer is {answer}.", out_dir=str(tmp_path / "run"),
                           recipe_config={"batch_size": 4, "steps_per_candidate": 2,
                                          "trainer": {"lr": 1e-3, "micro_batch_size": 4}})
    summary = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["releases"] == 1
    steps = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    assert len(steps) == 2 and all(math.isfinite(m["reverse_kl"]) and m["teacher_gap"] != 0 for m in steps)
    answers = {str(it["answer"]) for it in make_task().items(8, seed=0)}
    reports = scan_records(tmp_path / "run" / "data").filter(kind="report").collect().to_dicts()
    assert len(reports) == 8 and {r["context"].removeprefix("The correct answer is ").rstrip(".")
                                  for r in reports} == answers


def test_ctxd_runs_as_an_experiment_that_serves_a_harness_first(tiny_model_dir, tmp_path):
    """`harness`: the experiment publishes it before any rollout (the rollouts are served with it, the teacher's
    context), scores the base without and with it, and the weights release is judged and served without it."""
    from reef_lab.experiments.weights import ExperimentConfig, run_experiment
    from reef_lab.records.store import scan_records

    harness = "Answer with the number only."
    cfg = ExperimentConfig(name="ctxd", recipe="ctxd", rollouts=8, concurrency=4, max_pool=4, max_tokens=4,
                           harness={"system_prompt.md": harness}, out_dir=str(tmp_path / "run"),
                           recipe_config={"batch_size": 4, "steps_per_candidate": 2, "top_k": 8,
                                          "eval_task": {"name": "arithmetic"}, "eval_size": 4, "eval_max_tokens": 4,
                                          "retention_task": {"name": "colors"}, "retention_size": 4,
                                          "trainer": {"lr": 1e-3, "micro_batch_size": 4}})
    engine = EmbeddedEngine.from_path(str(tiny_model_dir))
    summary = run_experiment(cfg, engine=engine, progress=False)
    assert summary["releases"] == 2 and summary["serving"] == "ctxd:v2"
    assert {"base_accuracy", "harness_accuracy", "final_accuracy"} <= summary.keys()
    index = json.loads((tmp_path / "run" / "data" / "releases" / "ctxd" / "index.json").read_text())
    base_kept = index["base_retention"]  # the base alone on the retention task, scored before the harness served
    assert base_kept["release"] == "base" and base_kept["n"] == 4
    evals = scan_records(tmp_path / "run" / "data").filter(kind="eval").collect().to_dicts()
    kept = [r for r in evals if json.loads(r["tags"])["reef.release"] == "base"
            and "What color" in json.loads(r["request"])["messages"][-1]["content"]]
    alone = [engine.prompt_ids(json.loads(r["request"])["messages"]) == r["prompt_token_ids"] for r in kept]
    assert sorted(alone) == [False] * 4 + [True] * 4  # the base on the retention task alone, and with the harness
    records = scan_records(tmp_path / "run" / "data").filter(kind="inference").collect().to_dicts()
    assert len(records) == 8 and all(r["release_id"] == "ctxd:v1" for r in records)
    with_it = [engine.prompt_ids([{"role": "system", "content": harness}, *json.loads(r["request"])["messages"]])
               for r in records]
    assert [r["prompt_token_ids"] for r in records] == with_it  # rollouts served with the harness
    steps = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    assert len(steps) == 2 and all(m["prompt_tokens_saved"] > 0 and m["ctxd_skipped"] == 0 for m in steps)
    with pytest.raises(ValueError, match="harness"):
        ExperimentConfig(name="ctxd", recipe="ctxd", harness={"system_prompt.md": 3})


@pytest.mark.heavy
def test_a_distillation_experiments_wandb_run_has_its_divergence_and_teacher_gap(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    """W&B gets the keys the weights app draws: train/reverse_kl and train/teacher_gap per step (read back from the
    offline run with wandb's own reader)."""
    import subprocess
    import sys
    from pathlib import Path

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg, summary = opd_experiment(tiny_model_dir, tmp_path)
    (run,) = (Path(cfg.out_dir) / "data" / "wandb").glob("offline-run-*")
    out = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(run)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    history = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    history = [json.dumps(r) for r in history if r["type"] == "history"]
    steps = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    for key in ("train/reverse_kl", "train/teacher_gap"):
        assert sum(f'"{key}"' in h for h in history) == len(steps) == 2, key


def test_the_teacher_prompt_reads_any_dialect_and_the_template_is_not_a_format_string():
    """The context goes in through `{context}` alone: a client's template with other braces is kept as text (never
    str.format, which would read attributes or fail on `{0}`); an Anthropic request is read through reef_lab.wire."""
    from types import SimpleNamespace

    from reef_lab.learning.distill import context_prompts
    from reef_lab.trainers.samples import Sample

    records = {"a": {"id": "a", "dialect": "anthropic.messages", "request": {
        "model": "m", "max_tokens": 5, "system": "Be brief.", "messages": [{"role": "user", "content": "2+5?"}]}}}
    seen = []
    engine = SimpleNamespace(request_ids=lambda request: seen.append(request.messages) or [1, 2])
    store = SimpleNamespace(get_many=lambda ids: [records[i] for i in ids])
    sample = Sample("a", [1], [2], [-0.5], None, "base", context="It is 7.")
    assert context_prompts([sample], store, engine, "{0} {context.__class__} {context}") == [[1, 2]]
    assert seen == [[{"role": "system", "content": "Be brief.\n\n{0} {context.__class__} It is 7."},
                     {"role": "user", "content": "2+5?"}]]


def test_ctxd_distils_the_serving_harness_into_weights_served_without_it(gateway, tiny_model_dir):
    """Context distillation: the scenario serves a harness release; each reported answer (no score) teaches the
    weights without the harness what the model did with it; the weights release then serves the next call without
    the harness (a shorter prompt), and a rollback brings the harness back."""
    gateway.create_scenario({"name": "h", "recipe": "ctxd", "config": {
        "batch_size": 4, "steps_per_candidate": 2, "top_k": 8, "trainer": TRAINER, **EVAL}})
    harness = "Answer with the number only. Worked example: 2 + 3 = 5."
    rel = gateway.publish_harness("h", {"files": {"system_prompt.md": harness}})
    assert gateway.list_releases("h")["serving"] == rel["release_id"] == "h:v1"
    item = make_task().items(1, seed=9)[0]
    served = []
    for k, it in enumerate(make_task().items(8, seed=5)):
        receipt, release, _ = ask(gateway, "h", it, seed=k)
        assert release == "h:v1"
        served.append(gateway.get_record("h", receipt))
        gateway.report("h", {"references": [receipt], "feedback": "unscored"})
    ln = gateway.learner("h")
    assert ln.wait_idle(300) and ln.last_error is None, ln.status()
    assert gateway.list_releases("h")["serving"] == "h:v2"
    steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
    assert len(steps) == 2 and all(math.isfinite(m["forward_kl"]) and m["ctxd_skipped"] == 0 for m in steps)
    # the teacher's prompt is the served one; the student's is shorter by the harness
    engine = gateway.engine
    with_it = engine.prompt_ids([{"role": "system", "content": harness}, *item["messages"]])
    without = engine.prompt_ids(item["messages"])
    assert all(m["prompt_tokens_saved"] == len(with_it) - len(without) for m in steps)
    assert served[0]["prompt_token_ids"] == engine.prompt_ids([{"role": "system", "content": harness},
                                                               *make_task().items(8, seed=5)[0]["messages"]])
    # the candidate was judged as it serves: its held-out answers saw no harness
    evals = [r for r in gateway.store.get_many(gateway.store.ids("h", "eval")) if "reef.candidate" in r["tags"]]
    assert evals and all(r["prompt_token_ids"] == engine.prompt_ids(r["request"]["messages"]) for r in evals)
    # v2 serves the next call without the harness; rolling back to v1 serves it with the harness again
    receipt, release, _ = ask(gateway, "h", item, seed=99)
    assert release == "h:v2" and gateway.get_record("h", receipt)["prompt_token_ids"] == without
    gateway.rollback("h", {"release_id": "h:v1"})
    receipt, release, _ = ask(gateway, "h", item, seed=99)
    assert release == "h:v1" and gateway.get_record("h", receipt)["prompt_token_ids"] == with_it


def test_ctxd_refuses_a_harness_that_is_not_one(gateway):
    from reef_lab.learning.recipe import load_recipe

    with pytest.raises(BadRequest, match="must name a harness release"):
        load_recipe("ctxd", {"harness": "nope"})
    with pytest.raises(BadRequest, match="harness"):  # a client may not point a scenario at another's harness
        gateway.create_scenario({"name": "w", "recipe": "ctxd", "config": {"harness": "w:v7"}})
    gateway.create_scenario({"name": "w", "recipe": "ctxd", "config": {"harness": "w:v7", "trainer": TRAINER}},
                            operator=True)
    receipt, _, _ = ask(gateway, "w", make_task().items(1, seed=1)[0])
    gateway.report("w", {"references": [receipt], "feedback": "x"})
    assert "is not a harness release of this deployment" in gateway.learners.errors["w"], gateway.learners.errors


def test_ctxd_takes_a_samples_harness_only_from_its_own_scenario(gateway):
    """An imported record's release_id is whatever the importer wrote: a sample naming another scenario's harness
    release (`other:v1`) is not accepted, and that scenario's releases are never looked up (a scoped admin would
    otherwise learn which of another tenant's harness releases exist)."""
    for name in ("h", "other"):
        gateway.create_scenario({"name": name, "recipe": "ctxd", "config": {"trainer": TRAINER}})
        gateway.publish_harness(name, {"files": {"system_prompt.md": f"Be {name}."}})
    recipe = gateway.learner("h").recipe
    releaser = recipe._ctx.releaser
    asked, harness = [], releaser.harness
    releaser.harness = lambda scenario, release_id: asked.append(scenario) or harness(scenario, release_id)
    sample = lambda release_id: Sample("r", [1], [2], [-0.5], None, release_id)  # noqa: E731

    assert not recipe.accepts(sample("other:v1"))
    assert not recipe.accepts(sample("h:v1:other:v1")) and not recipe.accepts(sample("other"))
    assert "other" not in asked, asked
    assert recipe.accepts(sample("h:v1")) and set(asked) == {"h"}  # its own scenario's harness release teaches


@pytest.mark.heavy
def test_a_gguf_teacher_is_the_folder_the_engine_serves_it_from():
    """teacher.model_path may be a .gguf: dequantised once into the model cache, the same folder the embedded
    engine serves that file from (the default SmolLM2 GGUF: the default model's own folder), tokenizer checked."""
    from reef_lab.engines.embedded.loading import default_cache_dir, default_gguf_path, gguf_folder, load_model
    from reef_lab.learning.distill import TeacherConfig, resolve_teacher

    gguf = default_gguf_path()
    folder = gguf_folder(gguf)
    assert folder == default_cache_dir() / "SmolLM2-135M-Instruct" and (folder / "config.json").is_file()
    _, _, name = load_model(None, default_cache_dir())
    assert name == "SmolLM2-135M-Instruct"
    teacher = resolve_teacher(TeacherConfig(model_path=str(gguf)), folder, releaser=None)
    assert teacher.model_dir == folder and teacher.release_folder is None


def test_a_teacher_path_must_be_a_model_folder_or_a_gguf_file(tmp_path):
    from reef_lab.learning.distill import TeacherConfig

    with pytest.raises(ValueError, match="no such .gguf file"):
        TeacherConfig(model_path=str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="not a Hugging Face model folder .* or a .gguf file"):
        TeacherConfig(model_path=str(tmp_path))


def test_sdpo_runs_as_an_experiment_with_groups_scores_and_words(tiny_model_dir, tmp_path):
    """sdpo as an experiment: groups of rollouts per prompt (its group_size), each report a score and the words
    that name the answer; its steps carry the self-teacher's token log-ratio beside the group advantage."""
    from reef_lab.experiments.weights import ExperimentConfig, run_experiment

    cfg = ExperimentConfig(name="sdpo", recipe="sdpo", rollouts=8, concurrency=4, max_pool=8, max_tokens=4,
                           report_context="The correct answer is {answer}.", out_dir=str(tmp_path / "run"),
                           recipe_config={"group_size": 2, "batch_size": 8, "steps_per_candidate": 1,
                                          "trainer": {"lr": 1e-3, "micro_batch_size": 4}})
    assert cfg.group_size == 2  # the recipe's own groups
    summary = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["releases"] == 1
    [step] = [m for m in read_metrics(summary["metrics_file"]) if m["event"] == "step"]
    assert step["samples"] == 8 and step.get("teacher_gap") is not None


@pytest.mark.parametrize("recipe", ["sdft", "sdpo"])
def test_self_distillation_live_over_http_with_the_anthropic_sdk(gateway, recipe):
    """sdft and sdpo live: the Anthropic SDK's answers (sdpo: in groups, x-reef-tag-group) reported over HTTP with
    the words that name the answer (sdpo: and a score) train a release that serves the next call, no restart."""
    import anthropic

    config = {"batch_size": 4, "trainer": TRAINER, **({"group_size": 2} if recipe == "sdpo" else {})}
    gateway.create_scenario({"name": "s", "recipe": recipe, "config": config})
    running = Running(gateway)
    try:
        for k, item in enumerate(make_task().items(2, seed=3)):
            for g in range(2):
                client = anthropic.Anthropic(base_url=running.url, api_key="none", max_retries=0, default_headers={
                    "x-reef-scenario": "s", "x-reef-tag-group": f"p{k}"})
                raw = client.messages.with_raw_response.create(
                    model="tiny", max_tokens=6,
                    messages=[m for m in item["messages"] if m["role"] != "system"])
                r = requests.post(f"{running.url}/reef/report", headers={"x-reef-scenario": "s"}, timeout=60, json={
                    "references": [raw.headers["x-reef-agent-record-id"]], "score": float(g),
                    "context": f"The correct answer is {item['answer']}."})
                assert r.status_code == 200, r.text
        ln = gateway.learner("s")
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        client = anthropic.Anthropic(base_url=running.url, api_key="none", default_headers={"x-reef-scenario": "s"})
        raw = client.messages.with_raw_response.create(model="tiny", max_tokens=4,
                                                       messages=[{"role": "user", "content": "2 + 2?"}])
        assert raw.headers["x-reef-release-id"] == "s:v1"
        [step] = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
        assert step["samples"] == 4 and step.get("teacher_gap") is not None
    finally:
        running.server.shutdown()
