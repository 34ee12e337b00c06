"""The seams, used the way an extender meets them: a recipe that is one new folder of recipes/, a task and an engine
that are classes named by module:Class. Each is written here into a temporary folder (nothing outside it changes)
and driven through the real server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

import recipes
from reef_lab.config import parse_serve_config, ServeConfig
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.experiments.weights import ExperimentConfig, run_experiment
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.learner import read_metrics
from reef_lab.service import build_gateway
from tests.conftest import Running

RECIPE_INIT = "from .recipe import CloseRecipe as Recipe\n"

RECIPE_TASK = '''
import re

from reef_lab.tasks.base import Task


class NearTarget(Task):
    """Say a number near the target; the reward is continuous: 1 / (1 + |x - target|), 0 without a number."""

    def items(self, n, seed):
        target = self.config.options.get("target", 7)
        return [{"id": f"near-{seed}-{i}", "target": target,
                 "messages": [{"role": "user", "content": f"Say a number near {target}."}]} for i in range(n)]

    def score(self, item, text):
        found = re.findall(r"-?[0-9]+", text)
        return 0.0 if not found else 1.0 / (1.0 + abs(int(found[-1][:6]) - item["target"]))
'''

RECIPE = '''
"""`closeness`: REINFORCE with a batch-mean baseline on a continuous reward, the DIS loss of the core."""

from dataclasses import dataclass, field

from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import LearnConfig, require_score
from reef_lab.trainers.base import Loss


@dataclass
class CloseConfig(LearnConfig):
    batch_size: int = field(default=4, metadata={"help": "rollouts per policy step"})


class CloseRecipe(WeightRecipe):
    name = "closeness"

    def __init__(self, **config):
        self.config = CloseConfig(**config)

    def validate_report(self, report):
        require_score(self.name, report)

    def accepts(self, sample):
        return sample.score is not None and sample.logprobs is not None

    def ready(self, pool, trainer_step, release_steps):
        return len(pool) >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        batch = pool[: self.config.batch_size]
        mean = sum(s.score for s in batch) / len(batch)
        for s in batch:
            s.advantages = [s.score - mean] * len(s.completion_ids)
        return batch, []

    def train(self, trainer, batch):
        m = trainer.step(batch, Loss("dis"))
        return {**m, "policy_step": True, "reward_mean": sum(s.score for s in batch) / len(batch)}
'''


@pytest.fixture
def recipe_folder(tmp_path, monkeypatch):
    """recipes/closeness/ as an extender writes it: three files, in a folder the `recipes` package reads."""
    root = tmp_path / "more_recipes"
    folder = root / "closeness"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(RECIPE_INIT)
    (folder / "task.py").write_text(RECIPE_TASK)
    (folder / "recipe.py").write_text(RECIPE)
    monkeypatch.setattr(recipes, "__path__", [*recipes.__path__, str(root)])
    yield folder
    import sys
    for name in [m for m in sys.modules if m.startswith("recipes.closeness")]:
        del sys.modules[name]


def test_a_recipe_in_one_folder_trains_releases_and_serves(recipe_folder, tiny_model_dir, tmp_path):
    from openai import OpenAI

    config = {"batch_size": 4, "trainer": {"lr": 1e-3, "micro_batch_size": 4}, "eval_size": 4,
              "eval_max_tokens": 4, "eval_task": {"name": "recipes.closeness.task:NearTarget",
                                                  "options": {"target": 7}}}
    engine = EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=8)
    server = Running(Gateway(tmp_path / "data", engine, default_recipe="closeness", default_config=config))
    try:
        u = server.url
        # clients may choose the new folder by name, but never name code (the task's module:Class) themselves
        r = requests.post(u + "/reef/scenarios", json={"name": "picked", "recipe": "closeness"})
        assert r.status_code == 201, r.text
        r = requests.post(u + "/reef/scenarios", json={"name": "x", "recipe": "closeness", "config": {
            "eval_task": {"name": "recipes.closeness.task:NearTarget"}}})
        assert r.status_code == 400 and "eval_task.name" in r.json()["error"]["message"]

        from recipes.closeness.task import NearTarget
        from reef_lab.tasks.base import TaskConfig
        task = NearTarget(TaskConfig(name="recipes.closeness.task:NearTarget", options={"target": 7}))
        client = OpenAI(base_url=u + "/v1", api_key="unused", default_headers={"x-reef-scenario": "near"})
        scores = []
        for item in task.items(4, seed=1):
            raw = client.chat.completions.with_raw_response.create(
                model="tiny", messages=item["messages"], max_tokens=6, temperature=1.0, seed=len(scores))
            text = raw.parse().choices[0].message.content
            scores.append(task.score(item, text))
            rep = requests.post(u + "/reef/report", headers={"x-reef-scenario": "near"}, json={
                "score": scores[-1], "references": [raw.headers["x-reef-agent-record-id"]]})
            assert rep.status_code == 200 and rep.json()["created"], rep.text
        gw = server.gateway
        ln = gw.learner("near")
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        rels = gw.list_releases("near")
        assert rels["serving"] == "near:v1", rels
        evaluation = rels["releases"][0]["eval"]
        assert evaluation["n"] == 4 and 0.0 <= evaluation["accuracy"] <= 1.0  # the recipe's own task scored it
        steps = [m for m in read_metrics(ln.metrics_path) if m["event"] == "step"]
        assert steps and abs(steps[0]["reward_mean"] - sum(scores) / 4) < 1e-9
        raw = client.chat.completions.with_raw_response.create(model="tiny", max_tokens=3,
                                                               messages=[{"role": "user", "content": "hi"}])
        assert raw.headers["x-reef-release-id"] == "near:v1"
    finally:
        server.stop()


ENGINE = '''
from reef_lab.engines.base import Generation, Generator


class EchoStream:
    def __init__(self, text, prompt_ids):
        self.release_id, self.prompt_ids, self._text = "base", prompt_ids, text

    def __iter__(self):
        yield from (self._text[i:i + 3] for i in range(0, len(self._text), 3))

    def result(self, timeout=None):
        ids = list(self._text.encode())
        return Generation(self._text, ids, [0.0] * len(ids), self.prompt_ids, "stop", "base")

    def cancel(self):
        pass


class EchoEngine(Generator):
    """Answers with the last user message after a prefix: an engine in a dozen lines."""

    model_name = "echo"

    def __init__(self, prefix="echo: "):
        self.prefix = prefix

    @classmethod
    def from_config(cls, cfg):
        return cls(**cfg.engine_settings())

    @property
    def release_id(self):
        return "base"

    def release_for(self, scenario):
        return "base"

    def submit(self, request):
        last = [m["content"] for m in request.messages if m["role"] == "user"][-1]
        return EchoStream(self.prefix + last, list(last.encode()))

    def count_tokens(self, messages):
        return sum(len(m["content"].encode()) for m in messages)

    def info(self):
        return {"engine": "echo", "model_name": self.model_name}

    def close(self):
        pass
'''


def test_an_engine_named_by_module_class_serves_every_dialect(tmp_path, monkeypatch):
    import anthropic
    from openai import OpenAI

    (tmp_path / "echo_engine.py").write_text(ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = parse_serve_config(["--engine", "echo_engine:EchoEngine", "--engine-options", "{prefix: '>> '}",
                              "--data-dir", str(tmp_path / "data")])
    server = Running(build_gateway(cfg))
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", default_headers={"x-reef-scenario": "e"})
        raw = client.chat.completions.with_raw_response.create(
            model="echo", messages=[{"role": "user", "content": "hello there"}])
        assert raw.parse().choices[0].message.content == ">> hello there"
        receipt = raw.headers["x-reef-agent-record-id"]
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": "streamed"}], stream=True) if c.choices)
        assert streamed == ">> streamed"
        msg = anthropic.Anthropic(base_url=server.url, api_key="unused",
                                  default_headers={"x-reef-scenario": "e"}).messages.create(
            model="echo", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        assert msg.content[0].text == ">> hi"
        rec = requests.get(f"{server.url}/reef/scenarios/e/records/{receipt}").json()
        assert rec["token_ids"] == list(b">> hello there") and rec["prompt_token_ids"] == list(b"hello there")
        status = requests.get(server.url + "/reef/status").json()
        assert status["engine"]["engine"] == "echo"
    finally:
        server.stop()


def test_a_bad_engine_name_is_refused_at_start(tmp_path, capsys):
    for argv, says in ((["--engine", "nosuch"], "neither one of"),
                       (["--engine", "json:loads"], "not a reef_lab.engines.base.Engine subclass"),
                       (["--engine", "upstream", "--recipe", "sft"], "cannot serve")):
        with pytest.raises(SystemExit):
            parse_serve_config([*argv, "--data-dir", str(tmp_path)])
        assert says in capsys.readouterr().err


TASK = '''
from reef_lab.tasks.base import Task


class Parity(Task):
    """Is n even? The reward is continuous: 1 for the right word, 0.5 for a reply that names either."""

    def items(self, n, seed):
        return [{"id": f"parity-{seed}-{i}", "n": seed * 100 + i,
                 "messages": [{"role": "user", "content": f"Is {seed * 100 + i} even or odd?"}]} for i in range(n)]

    def score(self, item, text):
        right = "even" if item["n"] % 2 == 0 else "odd"
        return 1.0 if right in text.lower() else 0.5 if ("even" in text.lower() or "odd" in text.lower()) else 0.0
'''


def test_a_task_named_by_module_class_drives_an_experiment(tmp_path, monkeypatch, tiny_model_dir):
    (tmp_path / "parity_task.py").write_text(TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = ExperimentConfig(name="parity", recipe="sft", rollouts=8, concurrency=4, max_tokens=4,
                           out_dir=str(tmp_path / "run"), task={"name": "parity_task:Parity"}, recipe_config={
                               "batch_size": 4, "score_threshold": 0.0, "eval_size": 4, "eval_max_tokens": 4,
                               "eval_task": {"name": "parity_task:Parity"}, "trainer": {"lr": 1e-3}})
    summary = run_experiment(cfg, engine=EmbeddedEngine.from_path(str(tiny_model_dir)), progress=False)
    assert summary["releases"] >= 1 and summary["final_accuracy"] is not None
    rollouts = [json.loads(line) for line in (cfg.run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 8 and all(r["item"].startswith("parity-") for r in rollouts)
    assert all(r["score"] in (0.0, 0.5, 1.0) for r in rollouts)


def test_a_module_class_task_from_a_client_is_refused(tmp_path):
    cfg = ServeConfig(data_dir=str(tmp_path / "data"))
    assert cfg.engine_name() == "embedded"
    from reef_lab.learning.recipe import LearnConfig
    from reef_lab.schema import check_client_fields
    with pytest.raises(ValueError, match="names code to import"):
        check_client_fields(LearnConfig, {"eval_task": {"name": "os:system"}})
    check_client_fields(LearnConfig, {"eval_task": {"name": "arithmetic"}})  # short names are the client's


def test_a_data_dir_of_the_version_before_the_seams_opens_cleanly(tmp_path, stub_url):
    """tests/fixtures/datadir-c35e473 was written by reef_lab at commit c35e473 (records rolled to Parquet and in
    the log, a harness release, two scenarios, reports); this version serves it as it was."""
    import shutil

    from reef_lab.engines.upstream import UpstreamEngine

    src = Path(__file__).parent / "fixtures" / "datadir-c35e473"
    shutil.copytree(src, tmp_path / "data")
    expect = json.loads((src / "EXPECT.json").read_text())
    server = Running(Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=2.0)))
    try:
        u = server.url
        status = requests.get(u + "/reef/status").json()
        assert status["scenario_errors"] == {} and status["scenarios"] == 2
        info = requests.get(u + "/reef/scenarios/plain").json()
        assert info["records"]["inference"] == expect["n_plain_inference"] and info["records"]["report"] == 1
        first = requests.get(f"{u}/reef/scenarios/plain/records/{expect['first']}").json()
        assert first["request"]["messages"][0]["content"] == "q0"  # read back from the rolled Parquet segment
        assert requests.get(u + "/reef/harness", headers={"x-reef-scenario": "plain"}).json()["release_id"] == \
            "plain:v1"
        r = requests.post(u + "/v1/chat/completions", headers={"x-reef-scenario": "plain"},
                          json={"model": "m", "messages": [{"role": "user", "content": "new"}]})
        assert r.status_code == 200 and r.headers["x-reef-release-id"] == "plain:v1"
        graded = requests.post(u + "/reef/report", headers={"x-reef-scenario": "graded"},
                               json={"feedback": "no score", "references": []})
        assert graded.status_code == 400  # the stored config (require_score) still applies
    finally:
        server.stop()


GEPA_TASK = '''
from reef_lab.tasks.base import Task


class Brief(Task):
    """A continuous reward for short replies, and feedback text of the task's own."""

    def items(self, n, seed):
        return [{"id": f"brief-{seed}-{i}", "messages": [{"role": "user", "content": f"{seed + i} + 1 = ?"}]}
                for i in range(n)]

    def score(self, item, text):
        return 1.0 / (1.0 + len(text) / 10)

    def feedback(self, item, text):
        return f"BRIEF-FEEDBACK: {len(text)} characters"
'''


def test_a_task_named_by_module_class_drives_a_gepa_search(tmp_path, monkeypatch, stub_url):
    from recipes.gepa.experiment import GEPAExperimentConfig, run_gepa_experiment

    (tmp_path / "brief_task.py").write_text(GEPA_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    cfg = GEPAExperimentConfig(name="brief", task={"name": "brief_task:Brief"}, train_size=4, val_size=3,
                               test_size=3, task_lm=lm, out_dir=str(tmp_path / "r"),
                               reflection_lm={**lm, "record": str(tmp_path / "reflection.jsonl")},
                               search={"max_metric_calls": 12, "minibatch_size": 2})
    s = run_gepa_experiment(cfg, progress=False)
    assert 0.0 < s["seed_val"] < 1.0 and 0.0 < s["seed_test"] < 1.0  # the plug-in's continuous reward
    assert "BRIEF-FEEDBACK" in (tmp_path / "reflection.jsonl").read_text()  # its feedback reached reflection


OLD_STYLE_RECIPE = '''
from reef_lab.learning.recipe import LearnConfig


class OldStyle:
    """Written when the trainer config was a dict: reads it with .get and []."""

    name, evolves = "oldstyle", "nothing"

    def __init__(self, **config):
        self.config = LearnConfig(**config)
        self.lr = self.config.trainer.get("lr", 1e-5)
        self.rank = self.config.trainer["lora_rank"]

    def validate_report(self, report):
        pass

    def learner(self, ctx):
        return None
'''

BROKEN_RECIPE = '''
class Broken:
    name, evolves, config = "broken", "nothing", None

    def __init__(self, **config):
        self.window = config["windw"] if config else {}.missing  # a plug-in's own bug

    def validate_report(self, report):
        pass

    def learner(self, ctx):
        return None
'''


def test_plug_in_authors_get_clear_errors(tmp_path, monkeypatch, capsys, stub_url):
    """Issue 38 item 16: a recipe written against the dict trainer config still builds (with a DeprecationWarning);
    a recipe whose own code raises gives one line naming it, the error and where (at start) and a 500 saying so (to a
    client), not a traceback or 'internal error: AttributeError'; --recipe refuses a module or a class that is no
    recipe; a config typo is one line, not a 35-line usage."""
    (tmp_path / "old_style.py").write_text(OLD_STYLE_RECIPE)
    (tmp_path / "broken_recipe.py").write_text(BROKEN_RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from reef_lab.learning.recipe import load_recipe

    with pytest.warns(DeprecationWarning, match="TrainerConfig dataclass now"):
        recipe = load_recipe("old_style:OldStyle", {"trainer": {"lr": 0.5}})
    assert recipe.lr == 0.5 and recipe.rank == 0
    for argv, says in ((["--recipe", "broken_recipe:Broken"], "recipe 'broken_recipe:Broken' failed while it was "
                        "built: AttributeError: 'dict' object has no attribute 'missing' (raised at "),
                       (["--recipe", "os:path"], "names a module, not a class"),
                       (["--recipe", "json:JSONDecoder"], "is not a recipe: it needs the members"),
                       (["--recipe", "sft", "--recipe-config", "{batch_sise: 2}"], "unknown field(s) ['batch_sise']")):
        with pytest.raises(SystemExit) as exit_:
            parse_serve_config([*argv, "--data-dir", str(tmp_path / "data")])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err, (argv, err)
        assert len(err.strip().splitlines()) == 2 and "Traceback" not in err, err  # the error and where --help is
    from reef_lab.engines.upstream import UpstreamEngine

    server = Running(Gateway(tmp_path / "data", UpstreamEngine(stub_url), allowed_recipes=["broken_recipe:Broken"]))
    try:
        r = requests.post(server.url + "/reef/scenarios", json={"name": "b", "recipe": "broken_recipe:Broken"})
        assert r.status_code == 500, r.text
        msg = r.json()["error"]["message"]
        assert "recipe 'broken_recipe:Broken' failed while it was built: AttributeError" in msg, msg
        assert "internal error" not in msg
    finally:
        server.stop()
