"""A scenario's life: the names a new one may take (issue 38 item 14: they name folders and a Hub repo id) and what
deleting one leaves behind (item 11: nothing that serves or answers again under a scenario created later with the
same name)."""

from __future__ import annotations

import random

import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.errors import BadRequest
from reef_lab.gateway.gateway import Gateway
from reef_lab.harness.change_requests import RequestStore
from reef_lab.publishing.hub import HubConfig
from reef_lab.scenarios import NEW_NAME_MAX, check_name
from tests.conftest import Running
from tests.test_releaser import sft

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(url, scenario, session=None):
    h = {"x-reef-scenario": scenario, **({"x-reef-session": session} if session else {})}
    return requests.post(url + "/v1/chat/completions", json=CHAT, headers=h, timeout=30)


# ---- names (item 14) ---------------------------------------------------------------------------------------------
BAD_NEW = {"a..b": "holds '..'", "team--a": "holds '--'", "x.": "ends with '.', '_' or '-'",
           "x_": "ends with '.', '_' or '-'", "x-": "ends with '.', '_' or '-'", "repo.git": "ends in '.git'",
           "a" * (NEW_NAME_MAX + 1): "is longer than 64 characters"}


@pytest.mark.parametrize("name,why", sorted(BAD_NEW.items()))
def test_a_name_the_hub_or_a_folder_would_refuse_is_refused_at_creation(proxy, name, why):
    answers = [chat(proxy.url, name),
               requests.post(proxy.url + "/reef/scenarios", json={"name": name}, timeout=30),
               requests.post(proxy.url + "/reef/records/batch", json={"records": [{"scenario": name}]}, timeout=30),
               requests.post(proxy.url + "/reef/scenarios/" + name + "/harness",
                             json={"files": {"system_prompt.md": "x"}}, timeout=30)]
    for r in answers:
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert why in message and "starts and ends with a letter or digit, holds no '..' or '--'" in message
    assert proxy.gateway.scenarios.list() == []


def test_a_scenario_of_an_older_data_dir_with_such_a_name_still_works(tmp_path, stub_url):
    """Only creation is held to the new rule: a data dir made before keeps serving its scenarios."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "scenarios.json").write_text(  # as an older version wrote it
        '[{"name": "old..name", "recipe": "basic", "created_at": 1.0, "config": {}, "origin": "operator"}]')
    r = Running(Gateway(tmp_path / "data", UpstreamEngine(stub_url)))
    try:
        assert chat(r.url, "old..name").status_code == 200
        assert requests.get(r.url + "/reef/scenarios/old..name", timeout=30).json()["records"]["inference"] == 1
    finally:
        r.stop()


def test_every_name_allowed_makes_a_repo_id_the_hub_library_accepts():
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    hub = HubConfig(repo="me/reef-{scenario}")
    rng = random.Random(0)
    alphabet = "ab9Z._-"
    tried = accepted = 0
    for _ in range(20_000):
        name = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, NEW_NAME_MAX + 2)))
        tried += 1
        try:
            check_name(name, new=True)
        except BadRequest:
            continue
        accepted += 1
        validate_repo_id(hub.repo_for(name))  # raises HFValidationError for an id the Hub refuses
    assert accepted > 1000, (tried, accepted)
    for name in ("a..b", "team--a", "x.", "x-", "repo.git"):  # what the Hub refuses (a trailing '_' and the
        with pytest.raises(HFValidationError):                 # length are this rule's own: room for the template)
            validate_repo_id(f"me/{name}")


@pytest.mark.parametrize("repo", ["me/reef--{scenario}", "me/{scenario}-", "me/{scenario}.git", "me/.{scenario}",
                                  "me/" + "r" * 40 + "{scenario}"])
def test_a_hub_template_that_makes_ids_the_hub_refuses_is_refused_at_start(repo):
    with pytest.raises(ValueError, match="which the Hub refuses"):
        HubConfig(repo=repo)


# ---- deletion (item 11) ------------------------------------------------------------------------------------------
def test_a_deleted_scenario_serves_none_of_its_harness_releases_again(tmp_path, stub_url):
    data = tmp_path / "data"
    r = Running(Gateway(data, UpstreamEngine(stub_url)))
    try:
        for text in ("one", "two"):
            out = requests.post(r.url + "/reef/scenarios/s/harness", json={"files": {"system_prompt.md": text}},
                                timeout=30)
            assert out.status_code == 201
        assert chat(r.url, "s").headers["x-reef-release-id"] == "s:v2"
        assert requests.delete(r.url + "/reef/scenarios/s", timeout=30).status_code == 200
        again = chat(r.url, "s")  # the name's first call creates it again: with nothing of the old one
        assert again.status_code == 200 and again.headers["x-reef-release-id"] == "upstream"
        assert requests.get(r.url + "/reef/harness", headers={"x-reef-scenario": "s"}, timeout=30).status_code == 404
        rels = requests.get(r.url + "/reef/scenarios/s/releases", timeout=30).json()
        assert rels["serving"] == "base" and rels["releases"] == [] and rels["candidates"] == []
        kept = list((data / "deleted").glob("s.*/releases/index.json"))
        assert len(kept) == 1 and "s:v2" in kept[0].read_text()  # kept for inspection, out of the way
    finally:
        r.stop()
    r = Running(Gateway(data, UpstreamEngine(stub_url)))  # a restart restores nothing of the deleted one
    try:
        assert chat(r.url, "s").headers["x-reef-release-id"] == "upstream"
        out = requests.post(r.url + "/reef/scenarios/s/harness", json={"files": {"system_prompt.md": "new"}},
                            timeout=30)
        assert out.json()["release_id"] == "s:v3"  # never the old ids again (engine keys, Hub tags)
        assert chat(r.url, "s").headers["x-reef-release-id"] == "s:v3"
    finally:
        r.stop()


def test_a_deleted_scenarios_weights_are_unloaded_and_not_served_again(tiny_model_dir, tmp_path):
    from reef_lab.engines.embedded import EmbeddedEngine

    gw = Gateway(tmp_path / "data", EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=4))
    try:
        sft(gw, "w")
        assert gw.list_releases("w")["serving"] == "w:v1" and "w:v1" in gw.engine.loaded_releases()
        gw.delete_scenario("w")
        assert not any(k.startswith("w:") for k in gw.engine.loaded_releases())
        rec = gw.infer_record({"model": "tiny", "messages": CHAT["messages"], "max_tokens": 2}, "w")
        assert rec["release_id"] == "base"
        assert not (tmp_path / "data" / "learn" / "w").exists()  # its learner's state went with it
        assert list((tmp_path / "data" / "deleted").glob("w.*/learn"))
    finally:
        gw.close()


def test_change_requests_of_a_deleted_scenario_are_not_found(proxy):
    assert chat(proxy.url, "h").status_code == 200
    req = RequestStore(proxy.gateway.data_dir).create("h", {"text": "be brief"})
    url = f"{proxy.url}/reef/requests/{req['id']}"
    assert requests.get(url, timeout=30).json()["scenario"] == "h"
    requests.delete(proxy.url + "/reef/scenarios/h", timeout=30)
    assert requests.get(url, timeout=30).status_code == 404
    assert chat(proxy.url, "h").status_code == 200  # a scenario of that name again: still not its request
    r = requests.get(url, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["message"] == f"change request {req['id']!r} not found"
    assert requests.get(proxy.url + "/reef/scenarios/h/requests", timeout=30).json()["requests"] == []


def test_episodes_of_other_scenarios_read_after_a_deletion(proxy):
    """A deleted scenario's records not yet rolled into Parquet were still listed by the store's scan: the next
    episode read of any scenario answered 500 (KeyError)."""
    assert chat(proxy.url, "keep", session="run").status_code == 200
    assert chat(proxy.url, "gone").status_code == 200
    assert requests.delete(proxy.url + "/reef/scenarios/gone", timeout=30).status_code == 200
    r = requests.get(proxy.url + "/reef/episodes/run", headers={"x-reef-scenario": "keep"}, timeout=30)
    assert r.status_code == 200 and r.json()["turns"] == 1


# ---- one file per scenario (issue 50 item 7) ----------------------------------------------------------------------
def test_one_tenants_change_rewrites_no_other_tenants_state(tmp_path, stub_url):
    """One scenarios.json held every tenant's config and was rewritten whole on every change (8 large configs: 72 MB,
    another tenant's creation 189-281 ms). Each scenario is now a file of its own: creating or deleting one leaves
    every other scenario's file as it was."""
    from reef_lab.scenarios import ScenarioRegistry, stored_scenarios

    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url))
    try:
        big = {"seed_harness": {"AGENTS.md": "a" * 200_000}}
        gw.create_scenario({"name": "tenant-a", "recipe": "gepa", "config": big})
        files = {p.name: p for p in (tmp_path / "data" / "scenarios").iterdir()}
        assert sorted(files) == ["tenant-a.scenario.json"]
        before = files["tenant-a.scenario.json"].stat()
        gw.create_scenario({"name": "tenant-b"})
        gw.scenarios.ensure("tenant-c")
        gw.delete_scenario("tenant-b")
        after = files["tenant-a.scenario.json"].stat()
        assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
        assert sorted(p.name for p in (tmp_path / "data" / "scenarios").iterdir()) == \
            ["tenant-a.scenario.json", "tenant-c.scenario.json"]
        assert (tmp_path / "data" / "scenarios" / "tenant-c.scenario.json").stat().st_size < 1000
    finally:
        gw.close()
    names = [d["name"] for d in stored_scenarios(tmp_path / "data")]
    assert names == ["tenant-a", "tenant-c"]
    again = ScenarioRegistry(tmp_path / "data", "basic")
    assert again.get("tenant-a").config == big and again.get("tenant-a").origin == "client"


def test_an_earlier_versions_one_file_is_split_once(tmp_path, stub_url):
    from reef_lab.scenarios import stored_scenarios

    data = tmp_path / "data"
    data.mkdir()
    (data / "scenarios.json").write_text(
        '[{"name": "a", "recipe": "basic", "created_at": 1.0, "config": {}},'
        ' {"name": "b", "recipe": "basic", "created_at": 2.0, "config": {"require_score": true}}]')
    assert [d["name"] for d in stored_scenarios(data)] == ["a", "b"]  # read without writing
    assert not (data / "scenarios").exists()
    gw = Gateway(data, UpstreamEngine(stub_url))
    try:
        assert gw.scenarios.get("a").origin == "operator" and gw.scenarios.get("b").origin == "client"
        assert not (data / "scenarios.json").exists() and (data / "scenarios.json.migrated").is_file()
        assert sorted(p.name for p in (data / "scenarios").iterdir()) == ["a.scenario.json", "b.scenario.json"]
    finally:
        gw.close()
    gw = Gateway(data, UpstreamEngine(stub_url))  # the next start reads the files
    try:
        assert [s.name for s in gw.scenarios.list()] == ["a", "b"]
        assert gw.scenarios.get("b").config == {"require_score": True}
    finally:
        gw.close()
