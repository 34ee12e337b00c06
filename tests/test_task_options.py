"""A task's settings are checked when its config is built, not when the task first runs (issue 50, item 6): before,
`operators: ["**"]` or a calculator `max_digits: 1000000` created a scenario (201) whose first evaluation failed.
Now POST /reef/scenarios answers 400 naming the field, the server refuses such a --recipe-config at start, and each
task's own rules (what its generator can make and its verifier can score) are tested one by one here."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
import requests

from recipes.tttd.config import ProblemConfig
from reef_lab.config import parse_serve_config
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.errors import BadRequest
from reef_lab.gateway.gateway import Gateway
from reef_lab.tasks.base import TaskConfig, make_task
from tests.conftest import Running


@pytest.fixture
def server(tmp_path, tiny_model_dir):
    s = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir))))
    yield s
    s.stop()


def create(url: str, name: str, config: dict) -> requests.Response:
    return requests.post(url + "/reef/scenarios", json={"name": name, "recipe": "sft", "config": config}, timeout=60)


def test_a_client_config_whose_task_cannot_run_is_refused_naming_the_field(server):
    for k, (config, words) in enumerate([
        ({"eval_task": {"name": "arithmetic", "operators": ["**"]}}, "eval_task.operators"),
        ({"eval_task": {"name": "calculator", "options": {"max_digits": 1000000}}}, "eval_task.options.max_digits"),
        ({"eval_task": {"name": "calculator", "options": {"max_turns": 0}}}, "eval_task.options.max_turns"),
        ({"retention_task": {"name": "bfcl", "options": {"categories": ["simple_java"]}}},
         "retention_task.options.categories"),
        ({"eval_task": {"name": "arithmetic", "operators": ["+", "/"], "max_terms": 8}}, "eval_task.max_terms"),
    ]):
        r = create(server.url, f"s{k}", config)
        assert r.status_code == 400, (config, r.status_code, r.text)
        assert words in r.json()["error"]["message"], (config, r.json()["error"]["message"])
    assert requests.get(server.url + "/reef/scenarios", timeout=30).json()["scenarios"] == []
    r = create(server.url, "ok", {"eval_task": {"name": "calculator", "options": {"max_digits": 18, "max_turns": 3}}})
    assert r.status_code == 201, r.text


def test_the_operator_is_told_too_at_creation_and_at_start(server, capsys):
    with pytest.raises(BadRequest) as e:  # the arithmetic task's settings are the task config's own fields
        server.gateway.create_scenario({"name": "s", "recipe": "sft", "config": {
            "eval_task": {"name": "arithmetic", "options": {"operators": ["**"]}}}}, operator=True)
    assert "eval_task.options ['operators']: the arithmetic task takes none" in e.value.message, e.value.message
    assert "fields of the task config itself (operators" in e.value.message
    with pytest.raises(SystemExit):
        parse_serve_config(["--recipe", "sft", "--recipe-config", "{eval_task: {name: arithmetic, operators: ['**']}}"])
    assert "eval_task.operators" in capsys.readouterr().err


@pytest.mark.parametrize("config,words", [
    ({"operators": ["**"]}, r"operators \['\*\*'\]: the arithmetic generator .* knows only"),
    ({"operators": []}, r"operators \[\]: give at least one"),
    ({"operators": ["/"]}, r"operators \['/'\]: .*'/' needs one of"),
    ({"min_terms": 0}, "min_terms = 0: "),
    ({"min_digits": 0, "max_digits": 2}, "min_digits = 0: "),
    ({"operators": ["+", "/"], "max_terms": 4}, "max_terms = 4: with '/'"),
    ({"operators": ["*", "/"], "max_terms": 3, "max_digits": 6}, "max_digits = 6: with '/'"),
    ({"operators": ["-", "/"], "max_terms": 2, "max_digits": 11}, "max_digits = 11: with '/'"),
    ({"options": {"operators": ["**"]}},
     r"options \['operators'\]: the arithmetic task takes none .* task config itself \(operators"),
    ({"name": "colors", "options": {"n": 3}}, r"options \['n'\]: the colors task takes none"),
    ({"name": "jsonl", "path": "x.jsonl", "options": {"rows": 3}}, r"options \['rows'\]: the jsonl task takes none"),
    ({"name": "calculator", "options": {"max_digits": 1000000}}, r"options.max_digits = 1000000: .*at most 18"),
    ({"name": "calculator", "options": {"min_digits": 0}}, "options.min_digits = 0: "),
    ({"name": "calculator", "options": {"min_digits": 5, "max_digits": 4}}, "options.min_digits = 5: "),
    ({"name": "calculator", "options": {"forms": ["a - b"]}}, r"options.forms \['a - b'\]: "),
    ({"name": "calculator", "options": {"forms": []}}, r"options.forms \[\]: give at least one"),
    ({"name": "calculator", "options": {"schema": "other"}}, "options.schema 'other': "),
    ({"name": "calculator", "options": {"max_turns": 0}}, "options.max_turns = 0: "),
    ({"name": "calculator", "options": {"digits": 3}}, "options.digits is not a CalculatorOptions field"),
    ({"name": "bfcl", "options": {"categories": ["simple_java"]}},
     r"options.categories \['simple_java'\]: 'simple_java' is not one of"),
    ({"name": "bfcl", "options": {"category": ["multiple"]}}, "options.category is not a BfclOptions field"),
])
def test_each_tasks_bad_setting_is_refused_when_its_config_is_built(config, words):
    with pytest.raises(ValueError, match=words):
        TaskConfig(**config)


@pytest.mark.parametrize("config,words", [
    ({"tolerance": 0.5}, r"tolerance = 0.5: "),
    ({"tolerance": -1e-9}, r"tolerance = -1e-09: "),
    ({"cpu_seconds": 0}, "cpu_seconds = 0: "),
    ({"wall_seconds": 0}, "wall_seconds = 0: "),
    ({"memory_mb": 10}, "memory_mb = 10: "),
    ({"output_kb": 0}, "output_kb = 0: "),
])
def test_a_ttt_problems_bad_setting_is_refused_when_its_config_is_built(config, words):
    with pytest.raises(ValueError, match=words):
        ProblemConfig(**config)


@pytest.mark.parametrize("operators,terms,digits", [
    (["+", "-", "*", "/"], 3, 5),  # the most '/' allows with '*': a dividend of 10 digits
    (["-", "/"], 3, 9),  # without '*': a sum of two 9-digit numbers
    (["*", "/"], 2, 10),
    (["+", "-", "*"], 32, 32),  # no '/': the client caps are all it takes
])
def test_the_largest_allowed_arithmetic_generates_exact_items_quickly(operators, terms, digits):
    """Within the limits every item generates and its answer is the expression's exact value (with '/' and 4 or
    more terms reasoning-gym floors about 1 item in 60, and from 6 terms on it can divide by zero)."""
    task = make_task({"operators": operators, "min_terms": terms, "max_terms": terms, "max_digits": digits})
    items = task.items(64, seed=3)
    for it in items:
        expr = it["messages"][-1]["content"].removeprefix("Calculate ").rstrip(".")
        expr = re.sub(r"\d+", lambda m: f"Fraction({m.group(0)})", expr)
        assert eval(expr) == Fraction(it["answer"]), it  # noqa: S307 - digits, operators and parentheses
