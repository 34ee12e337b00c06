"""What a newcomer writing a recipe reaches for: the tests' tiny model served by name, a live client that drives any
task, and `serve.py --help` naming the recipe folders there are."""

from __future__ import annotations

import re

import pytest
import requests
import torch

from reef_lab.config import ServeConfig, parse_serve_config
from reef_lab.engines.tiny import tiny_model_dir
from reef_lab.learning.recipe import shipped_recipes
from reef_lab.learning.tasks import Task
from reef_lab.service import build_engine


class EchoTask(Task):
    """Items the stub provider answers right by echoing them."""

    def items(self, n, seed):
        return [{"id": f"e{i}", "messages": [{"role": "user", "content": f"say {seed}-{i}"}]} for i in range(n)]

    def score(self, item, text):
        return 1.0 if text == "echo: " + item["messages"][-1]["content"] else 0.0


def test_the_tests_tiny_model_serves_by_name(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("REEF_LAB_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "data"
    engine = build_engine(ServeConfig(model_path="tiny", data_dir=str(data)))  # before: "model_path 'tiny' is
    try:  # neither a .gguf file ..."; it is built into the data dir, the user's model cache is not written (issue 38)
        assert engine.model_name == "tiny" and engine.model_dir == data / "models" / "tiny-llama"
        assert not (tmp_path / "cache").exists()
        from transformers import AutoModelForCausalLM

        built = AutoModelForCausalLM.from_pretrained(engine.model_dir).state_dict()
        assert all(torch.equal(built[k], v) for k, v in tiny_model.state_dict().items())  # the tests' own model
        assert sum(v.numel() for v in built.values()) < 10_000_000
    finally:
        engine.close()
    assert tiny_model_dir(tmp_path / "cache") == tmp_path / "cache" / "tiny-llama"  # built once, found again


def test_the_live_client_drives_any_task_by_name(proxy):
    from scripts.live_client import main

    main(["--url", proxy.url, "--scenario", "echo", "--task", "tests.test_newcomer:EchoTask", "--rollouts", "4",
          "--concurrency", "2", "--feedback", "--wait", "0"])
    reports = requests.get(proxy.url + "/reef/scenarios/echo/records?kind=report").json()["records"]
    assert len(reports) == 4 and {r["score"] for r in reports} == {1.0}
    assert {r["feedback"] for r in reports} == {"score 1"} and all(r["metadata"] is None for r in reports)


def test_the_live_client_refuses_an_unknown_task(capsys):
    from scripts.live_client import main

    with pytest.raises(SystemExit):
        main(["--task", "arithmatic"])
    assert "task name must be one of" in capsys.readouterr().err


def test_serve_help_lists_the_recipe_folders(capsys):
    with pytest.raises(SystemExit):
        parse_serve_config(["--help"])
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert f"one of the folders of recipes/ ({', '.join(shipped_recipes())})" in out
    assert {"basic", "composite", "tttd"} <= set(shipped_recipes())  # before: a list written in the help text
