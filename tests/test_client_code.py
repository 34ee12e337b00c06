"""A client never makes the server import code, whatever field it uses, and never sets the operator's fields.

Walks every shipped recipe's config schema (every field at every depth, through the `schema` metadata) and sends a
`module:Class` string naming a module whose import leaves a marker file in each field, through POST /reef/scenarios:
each is a 400 that says the string names code, and nothing is imported. Then: the exact TTT-Discover reproduction of
issue 28 (problem.name), the sandbox limits (operator-only), a scenario stored by an older version (a client's config
with code, read back at start), and the loader's own guard in a server process (reef_lab.plugins.restrict_to).
"""

from __future__ import annotations

import json
import sys
import typing
import uuid
from dataclasses import fields, is_dataclass

import orjson
import pytest
import requests

from reef_lab import plugins
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.recipe import load_recipe, shipped_recipes
from reef_lab.tasks.base import Task, make_task
from reef_lab.schema import config_class
from tests.conftest import Running


@pytest.fixture
def bait(tmp_path, monkeypatch):
    """(module:Class path, marker file): a module on sys.path whose import writes the marker."""
    name = f"reef_bait_{uuid.uuid4().hex[:10]}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nclass X:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:X", marker
    assert name not in sys.modules and not marker.exists(), "the server imported a client's module"


@pytest.fixture
def server(tmp_path, tiny_model_dir):
    """The embedded engine (so recipes that train weights are accepted) behind the real app on loopback."""
    s = Running(Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir))))
    yield s
    s.stop()


def post(url, path, body):
    return requests.post(url + path, data=json.dumps(body), headers={"Content-Type": "application/json"}, timeout=60)


def leaf_configs(cls: type, value: str) -> list[tuple[str, dict]]:
    """(dotted field, a config setting just that field to `value`) for every field of `cls` at every depth: a
    mapping field with a schema, or typed with a config dataclass, is walked; a free mapping gets `value` as a value and as a key; a list holds it."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        schema = f.metadata.get("schema") or config_class(hints.get(f.name))
        if schema is not None:
            schema = schema if is_dataclass(schema) else schema()
            out += [(f"{f.name}.{k}", {f.name: cfg}) for k, cfg in leaf_configs(schema, value)]
            continue
        tp = hints.get(f.name)
        origin = typing.get_origin(tp)
        out.append((f.name, {f.name: value}))
        if tp is dict or origin is dict or (typing.get_args(tp) and dict in typing.get_args(tp)):
            out += [(f"{f.name}{{value}}", {f.name: {"x": value}}), (f"{f.name}{{key}}", {f.name: {value: 1}})]
        if tp is list or origin is list or any(typing.get_origin(a) is list for a in typing.get_args(tp)):
            out.append((f"{f.name}[0]", {f.name: [value]}))
    return out


def test_no_field_of_any_recipe_takes_code_from_a_client(server, bait):
    path, _ = bait
    tried = []
    for recipe in shipped_recipes():
        config = load_recipe(recipe).config
        if config is None:
            continue
        for k, (where, cfg) in enumerate(leaf_configs(type(config), path)):
            r = post(server.url, "/reef/scenarios", {"name": f"{recipe}-{k}", "recipe": recipe, "config": cfg})
            msg = r.json()["error"]["message"] if r.status_code == 400 else r.text
            assert r.status_code == 400 and "names code to import" in msg, (recipe, where, r.status_code, msg)
            tried.append(f"{recipe}:{where}")
    assert "tttd:problem.name" in tried and "gepa:val_task.options{key}" in tried and len(tried) > 300, tried
    assert requests.get(server.url + "/reef/scenarios").json()["scenarios"] == []
    # the same strings anywhere else in the config: a list of mappings, padded with blanks
    r = post(server.url, "/reef/scenarios", {"name": "deep", "recipe": "gepa", "config": {
        "seed_harness": {"files": [{"a": [f"  {path}\n"]}]}}})
    assert r.status_code == 400 and "config.seed_harness.files[0].a[0]" in r.json()["error"]["message"]


def test_the_ttt_discover_reproduction_of_issue_28(server, bait):
    path, marker = bait
    r = post(server.url, "/reef/scenarios", {"name": "x", "recipe": "tttd", "config": {
        "mode": "manual", "problem": {"name": path}}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith(f"config.problem.name = {path!r} names code to import")
    assert post(server.url, "/reef/train", {"scenario": "x"}).status_code == 404
    # the built-in names still work
    r = post(server.url, "/reef/scenarios", {"name": "ok", "recipe": "tttd", "config": {
        "mode": "manual", "problem": {"name": "circle_centres", "n": 5}}})
    assert r.status_code == 201, r.text


def test_sandbox_limits_are_the_operators(server):
    for field, value in [("cpu_seconds", 100000), ("memory_mb", 100000), ("wall_seconds", 1e9),
                         ("output_kb", 100000), ("disk_mb", 100000), ("disk_inodes", 10**9), ("sandbox", "none")]:
        r = post(server.url, "/reef/scenarios", {"name": "t", "recipe": "tttd", "config": {
            "mode": "manual", "problem": {"name": "circle_packing", field: value}}})
        assert r.status_code == 400, (field, r.text)
        assert f"config.problem.{field} can be set only by the server's operator" in r.json()["error"]["message"]
    r = post(server.url, "/reef/scenarios", {"name": "t", "recipe": "tttd", "config": {
        "mode": "manual", "problem": {"cpu_seconds": 100000, "memory_mb": 100000, "wall_seconds": 1e9}}})
    assert r.status_code == 400 and "config.problem.cpu_seconds" in r.text
    assert requests.get(server.url + "/reef/scenarios").json()["scenarios"] == []


def test_a_clients_scenario_stored_before_the_fix_imports_nothing_on_restart(tmp_path, tiny_model_dir, bait):
    """scenarios.json of an older version (no `origin`) holding a client's config with code: at start the scenario
    serves and records, says why it does not learn, and training imports nothing; the operator's own scenario
    (its config is the deployment's) still learns."""
    path, _ = bait
    data = tmp_path / "data"
    data.mkdir()
    (data / "scenarios.json").write_bytes(orjson.dumps([
        {"name": "old", "recipe": "tttd", "created_at": 1.0, "config": {"mode": "manual", "problem": {"name": path}}},
        {"name": "limits", "recipe": "tttd", "created_at": 1.0, "config": {"mode": "manual",
                                                                          "problem": {"cpu_seconds": 100000}}},
        {"name": "mine", "recipe": "tttd", "created_at": 1.0, "config": {"mode": "manual"}}]))
    s = Running(Gateway(data, EmbeddedEngine.from_path(str(tiny_model_dir)), default_recipe="tttd",
                        default_config={"mode": "manual"}))
    try:
        for name in ("old", "limits"):
            r = post(s.url, "/reef/train", {"scenario": name})
            assert r.status_code == 409, r.text
            error = requests.get(s.url + f"/reef/scenarios/{name}").json()["error"]
            assert ("names code to import" if name != "limits" else "can be set only by the server's operator") \
                in error, error
        assert s.gateway.recipe("mine").name == "tttd" and s.gateway.learners.errors.get("mine") is None
    finally:
        s.stop()


@pytest.fixture
def restricted():
    yield plugins.restrict_to
    plugins.unrestricted()


def test_a_server_process_imports_only_what_its_operator_named(restricted, bait):
    """The loader's own guard: in a process that serves clients (server/wsgi.py calls restrict_to with the
    operator's paths) a path from anywhere else is refused before anything is imported, whatever field carried it;
    the code's built-in names and the operator's paths still load."""
    path, _ = bait
    restricted(["reef_lab.tasks.base:ArithmeticTask"])
    with pytest.raises(ValueError, match="did not name"):
        make_task({"name": path})
    with pytest.raises(ValueError, match="did not name"):
        plugins.load_class(path, object, "anything")
    assert make_task({"name": "arithmetic"}) is not None  # a built-in short name
    assert issubclass(plugins.load_class("reef_lab.tasks.base:ArithmeticTask", Task, "task"), Task)
    # malformed paths never reach the importer, restricted or not
    plugins.unrestricted()
    for bad in (f" {path}", f"{path}\n", f"{path}.Y", "os.path:join:x", "../x:Y"):
        with pytest.raises(ValueError, match="not a module:Class path"):
            plugins.load_class(bad, object, "x")


def test_the_operator_names_code_in_its_own_config(tmp_path):
    """What restrict_to is given: every module:Class of the options, the recipe config (at any depth), the engine
    options and the allowed recipes."""
    from reef_lab.config import ServeConfig

    cfg = ServeConfig(recipe="tttd", recipe_config='{problem: {name: "recipes.tttd.problems:CircleCentres"}, '
                      'eval_task: {name: "a.b:C"}}', allowed_recipes="x.y:Z, sft", data_dir=str(tmp_path))
    assert sorted(cfg.code_paths()) == ["a.b:C", "recipes.tttd.problems:CircleCentres", "x.y:Z"]
