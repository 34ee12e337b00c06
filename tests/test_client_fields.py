"""What a client may set in a scenario's config is an allow-list derived from the typed configs, at every depth and
inside every container (issue 38, item 1).

The attack of the issue: a client created a `composite` scenario whose components' configs (a plain mapping the old
check did not enter) sent the server's tokens to a URL of the client's choosing (`task_lm` with `base_url` +
`key_env`), wrote a file where the client said (`record:`) and turned the TTT sandbox off. Each is refused here over
HTTP, and a listener on loopback checks that nothing reached the client's URL. Then the rule itself: every shipped
recipe, walked through composite components too, refuses each operator-only field and each free-form mapping, and
caps the numbers that size the server's work.
"""

from __future__ import annotations

import http.server
import json
import threading
import typing
from dataclasses import fields, is_dataclass

import pytest
import requests

from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.recipe import recipe_config_class, shipped_recipes
from reef_lab.schema import check_client_fields, client_fields, config_class
from tests.conftest import Running


@pytest.fixture
def server(tmp_path, tiny_model_dir):
    s = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir))))
    yield s
    s.stop()


@pytest.fixture
def listener():
    """A loopback HTTP server that keeps every request it gets: where a client would have the server send keys."""
    got = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            got.append((self.path, dict(self.headers)))
            self.send_response(500)
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}/v1", got
    srv.shutdown()


def create(url, name, recipe, config):
    return requests.post(url + "/reef/scenarios", json={"name": name, "recipe": recipe, "config": config}, timeout=60)


def message(r) -> str:
    return r.json()["error"]["message"] if r.status_code == 400 else f"{r.status_code} {r.text}"


def test_the_composite_attack_of_the_issue_is_refused(server, listener, tmp_path, monkeypatch):
    evil, got = listener
    monkeypatch.setenv("REEF_TOKEN", "secret-admin-token")
    lm = {"kind": "openai", "base_url": evil, "model": "m", "key_env": "REEF_TOKEN"}
    written = tmp_path / "stolen.jsonl"
    attacks = [
        ("task_lm", {"harness": {"recipe": "gepa", "config": {"mode": "manual", "task_lm": lm}}}),
        ("reflection_lm", {"harness": {"recipe": "gepa", "config": {"reflection_lm": lm}}}),
        ("requests.proposer_lm", {"harness": {"recipe": "gepa", "config": {"requests": {"proposer_lm": lm}}}}),
        ("task_lm", {"harness": {"recipe": "gepa", "config": {"task_lm": {"kind": "engine", "record": str(written)}}}}),
        ("problem.sandbox", {"weights": {"recipe": "tttd", "config": {"mode": "manual",
                                                                       "problem": {"sandbox": "none"}}}}),
        ("problem.memory_mb", {"weights": {"recipe": "tttd", "config": {"problem": {"memory_mb": 100_000}}}}),
        ("eval_task.path", {"weights": {"recipe": "sft", "config": {
            "eval_task": {"name": "jsonl", "path": "/etc/shadow"}}}}),
        ("trainer.options", {"weights": {"recipe": "sft", "config": {"trainer": {"options": {"save": "/tmp/x"}}}}}),
        ("trainer.device", {"weights": {"recipe": "sft", "config": {"trainer": {"device": "cuda:7"}}}}),
    ]
    for k, (field_name, components) in enumerate(attacks):
        r = create(server.url, f"attack-{k}", "composite", {"components": components})
        assert r.status_code == 400, (field_name, r.status_code, r.text)
        assert field_name in message(r) and "operator" in message(r), (field_name, message(r))
        assert message(r).startswith("config.components."), message(r)
    assert requests.get(server.url + "/reef/scenarios", timeout=30).json()["scenarios"] == []
    assert got == [] and not written.exists()
    # the same fields one level up, without composite, are refused as before
    r = create(server.url, "plain", "gepa", {"task_lm": lm})
    assert r.status_code == 400 and "config.task_lm can be set only by the server's operator" in message(r)
    # and a composite a client may make: short names, typed fields within the caps
    r = create(server.url, "ok", "composite", {"components": {
        "weights": {"recipe": "sft", "config": {"mode": "manual", "batch_size": 4,
                                                "eval_task": {"name": "calculator", "options": {"max_turns": 3}}}},
        "harness": {"recipe": "gepa", "config": {"mode": "manual", "seed_harness": {"system_prompt.md": "Be brief."},
                                                 "search": {"max_metric_calls": 50}}}}})
    assert r.status_code == 201, r.text


def test_a_component_must_name_a_shipped_recipe_other_than_composite(server):
    for recipe in ("composite", "nope", "../gepa", "gepa.recipe"):
        r = create(server.url, "c", "composite", {"components": {"harness": {"recipe": recipe, "config": {}}}})
        assert r.status_code == 400 and "recipe" in message(r), (recipe, message(r))


def test_clients_get_caps_on_the_numbers_that_size_the_servers_work(server):
    for field_name, value, most in [("concurrency", 10_000, 32), ("groups", 1000, 16), ("rollouts_per_group", 512, 64),
                                    ("max_tokens", 10**7, 32768)]:
        r = create(server.url, "t", "tttd", {"mode": "manual", field_name: value})
        assert r.status_code == 400, (field_name, r.text)
        assert f"config.{field_name} = {value} is more than a client may ask for (at most {most})" in message(r)
    r = create(server.url, "g", "gepa", {"search": {"max_metric_calls": 10**9}})
    assert r.status_code == 400 and "config.search.max_metric_calls" in message(r)
    r = create(server.url, "s", "sft", {"trainer": {"micro_batch_size": 4096}})
    assert r.status_code == 400 and "config.trainer.micro_batch_size" in message(r)
    # within the caps: fine (groups 2 x rollouts 4: a small grid)
    r = create(server.url, "t", "tttd", {"mode": "manual", "groups": 2, "rollouts_per_group": 4, "concurrency": 4})
    assert r.status_code == 201, r.text


def test_free_form_mappings_are_the_operators():
    """A task's options are typed by the task (calculator, bfcl); where a task types none, they are free-form."""
    sft = recipe_config_class("sft")
    check_client_fields(sft, {"eval_task": {"name": "bfcl", "options": {"categories": ["multiple"]}}})
    with pytest.raises(ValueError, match=r"config.eval_task.options is a free-form mapping"):
        check_client_fields(sft, {"eval_task": {"name": "arithmetic", "options": {"anything": 1}}})
    check_client_fields(sft, {"eval_task": {"name": "arithmetic", "options": {}}})  # nothing set

    class Untyped:  # a plug-in recipe whose config is no dataclass: a client may set none of it
        pass
    with pytest.raises(ValueError, match="not typed"):
        check_client_fields(Untyped, {"x": 1})
    check_client_fields(Untyped, {})


def walk(cls: type, prefix: str = ""):
    """(dotted key, metadata, declared type) of every field of config dataclass `cls` at every depth."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        schema = f.metadata.get("schema") or config_class(hints.get(f.name))
        yield prefix + f.name, f.metadata, hints.get(f.name)
        if schema is not None:
            yield from walk(schema if is_dataclass(schema) else schema(), f"{prefix}{f.name}.")


def nest(key: str, value) -> dict:
    out = value
    for part in reversed(key.split(".")):
        out = {part: out}
    return out


def test_every_operator_field_of_every_recipe_is_refused_directly_and_inside_a_composite():
    tried = 0
    for recipe in shipped_recipes():
        cls = recipe_config_class(recipe)
        if cls is None or recipe == "composite":
            continue
        for key, meta, _ in walk(cls):
            if not meta.get("operator"):
                continue
            config = nest(key, "x")
            parts = key.split(".")  # the field itself or an operator-only field it sits in is named
            named = [".".join(parts[:i]) + " can be set only by the server's operator" for i in range(1, len(parts) + 1)]
            with pytest.raises(ValueError) as direct:
                check_client_fields(cls, config)
            assert any(f"config.{n}" in str(direct.value) for n in named), (recipe, key, direct.value)
            component = "harness" if recipe == "gepa" else "weights"
            with pytest.raises(ValueError) as nested:
                check_client_fields(recipe_config_class("composite"), {"components": {
                    component: {"recipe": recipe, "config": config}}})
            assert any(f"config.components.{component}.config.{n}" in str(nested.value) for n in named), \
                (recipe, key, nested.value)
            tried += 1
    assert tried >= 30, tried  # gepa's LMs, every task's path, every trainer's backend and device, the sandbox


# Integer fields a client may set without a cap: they choose among items or shape nothing the server pays for.
UNCAPPED_INTS = {"eval_seed", "val_seed", "seed", "min_terms", "min_digits", "max_staleness", "critic_warmup_steps",
                 "search.seed", "trainer.seed", "eval_task.min_terms", "eval_task.min_digits", "val_task.min_terms",
                 "val_task.min_digits", "max_waiting"}


def test_every_client_integer_is_capped_or_reviewed():
    """A new integer field a client can set must say how much a client may ask for (`client_max`), or be added to
    UNCAPPED_INTS with its reason: so a field that sizes work is never open-ended by oversight."""
    open_ended = []
    for recipe in shipped_recipes():
        cls = recipe_config_class(recipe)
        for key, meta in client_fields(cls) if cls else []:
            tp = dict((k, t) for k, _, t in walk(cls)).get(key)
            if tp is int and "client_max" not in meta and key not in UNCAPPED_INTS \
                    and key.rsplit(".", 1)[-1] not in UNCAPPED_INTS:
                open_ended.append(f"{recipe}:{key}")
    assert open_ended == [], open_ended
