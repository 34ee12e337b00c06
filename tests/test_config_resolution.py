"""Configs are checked whole when they are built, and kept as the dataclasses they were checked as: every
`module:Class` (task, trainer backend, TTT problem, engine) is resolved and its own options checked when a scenario
is created or the server starts, an experiment's YAML before any model loads, and a top-level typo is named with the
fields there are."""

from __future__ import annotations

import pytest
import requests

from recipes.tttd.config import TTTDConfig
from reef_lab.config import ServeConfig, parse_serve_config
from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.errors import BadRequest
from reef_lab.experiments.weights import ExperimentConfig
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.recipe import load_recipe
from reef_lab.tasks.base import Task, TaskConfig
from reef_lab.trainers.base import TrainerConfig
from tests.conftest import Running


class PickyTask(Task):
    """A plug-in task that checks its own options when the config is built."""

    def items(self, n, seed):
        return [{"id": str(i), "messages": [{"role": "user", "content": "hi"}]} for i in range(n)]

    def score(self, item, text):
        return 0.0

    @classmethod
    def check_config(cls, config):
        if set(config.options) - {"level"}:
            raise ValueError(f"options: PickyTask takes only 'level', got {sorted(config.options)}")


def test_nested_configs_are_kept_as_the_dataclasses_they_were_checked_as():
    recipe = load_recipe("sft", {"eval_task": {"name": "arithmetic"}, "trainer": {"lr": 2e-5}})
    assert isinstance(recipe.config.trainer, TrainerConfig) and recipe.config.trainer.lr == 2e-5
    assert isinstance(recipe.config.eval_task, TaskConfig)
    assert isinstance(load_recipe("sft").config.trainer, TrainerConfig)  # the default too


@pytest.mark.parametrize("config,words", [
    ({"eval_task": {"name": "tests.nowhere:Task"}}, "task 'tests.nowhere:Task' cannot be loaded"),
    ({"eval_task": {"name": "tests.test_config_resolution:PickyTask", "options": {"levle": 1}}},
     "PickyTask takes only 'level'"),
    ({"trainer": {"backend": "tests.nowhere:Trainer"}}, "trainer backend 'tests.nowhere:Trainer' cannot be loaded"),
    ({"trainer": {"options": {"spool_dir": "/x"}}}, "backend 'torch' takes no options"),
])
def test_plugins_are_resolved_and_checked_when_the_scenario_is_created(tmp_path, config, words):
    gw = Gateway(tmp_path / "data", UpstreamEngine("http://127.0.0.1:9", timeout=1.0), allowed_recipes=["gepa"])
    try:
        with pytest.raises(BadRequest) as e:  # before: created, and the learner failed on the first report
            gw.create_scenario({"name": "s", "recipe": "sft", "config": config}, operator=True)
        assert words in e.value.message, e.value.message
        assert not gw.scenarios.exists("s")
    finally:
        gw.close()


def test_a_ttt_problem_path_is_resolved_when_the_config_is_built():
    with pytest.raises(ValueError, match="problem.name 'tests.nowhere:Problem' cannot be loaded"):
        TTTDConfig(problem={"name": "tests.nowhere:Problem"})


def test_the_server_refuses_an_unloadable_plugin_at_start(capsys):
    with pytest.raises(SystemExit):
        parse_serve_config(["--recipe", "sft", "--recipe-config", "{eval_task: {name: 'tests.nowhere:Task'}}"])
    assert "tests.nowhere:Task" in capsys.readouterr().err
    with pytest.raises(ValueError, match="the embedded engine takes no engine_options"):
        ServeConfig(engine_options="{threads: 2}")  # the embedded engine has none
    with pytest.raises(ValueError, match="engine_options"):
        ServeConfig(engine="sglang", engine_options="{url: http://x, trasport: lora}")


def test_a_client_cannot_name_code_in_a_nested_typed_field(tmp_path):
    srv = Running(Gateway(tmp_path / "data", UpstreamEngine("http://127.0.0.1:9", timeout=1.0)))
    try:
        r = requests.post(srv.url + "/reef/scenarios", json={"name": "c", "recipe": "gepa", "config": {
            "val_task": {"name": "tests.test_config_resolution:PickyTask"}}})
        assert r.status_code == 400 and "val_task.name" in r.json()["error"]["message"]
    finally:
        srv.stop()


def test_a_top_level_typo_gets_the_field_list():
    with pytest.raises(BadRequest) as e:  # before: "__init__() got an unexpected keyword argument 'batch_sise'"
        load_recipe("sft", {"batch_sise": 4})
    assert "unknown field(s) ['batch_sise']" in e.value.message and "'batch_size'" in e.value.message
    with pytest.raises(ValueError) as e:
        ExperimentConfig.parse({"recipe": "sft", "rollout": 8})
    assert "experiment.rollout is not a ExperimentConfig field" in str(e.value) and "'rollouts'" in str(e.value)


def test_an_experiment_yaml_is_checked_before_any_model_loads(monkeypatch):
    from reef_lab import experiments
    from reef_lab.experiments import driver

    def no_engine(*a, **kw):
        raise AssertionError("an engine was built before the config was checked")
    monkeypatch.setattr(driver.ExperimentDriver, "build_engine", no_engine)
    for data, words in [({"recipe": "sft", "task": {"name": "arithmatic"}}, "task name must be one of"),
                        ({"recipe": "sft", "task": {"name": "tests.nowhere:Task"}}, "cannot be loaded"),
                        ({"recipe": "sft", "wandb": {"mdoe": "offline"}}, "wandb.mdoe"),
                        ({"recipe": "sft", "engine": "nosuch"}, "engine 'nosuch'"),
                        ({"recipe": "gepa", "task": {"name": "arithmatic"}}, "task name must be one of"),
                        ({"recipe": "tttd", "config": {"problem": {"name": "x:Y"}}}, "problem.name")]:
        with pytest.raises(ValueError, match=words):
            experiments.run(data, progress=False)


def test_a_plugin_task_does_not_inherit_arithmetics_system_prompt():
    assert TaskConfig().system_prompt == "Answer with the final number only."
    plugin = TaskConfig(name="tests.test_config_resolution:PickyTask")
    assert plugin.system_prompt == ""  # before: "Answer with the final number only."
    assert TaskConfig(name="tests.test_config_resolution:PickyTask", system_prompt="Be brief.").system_prompt == \
        "Be brief."
