"""A scenario's life: the names a new one may take (issue 38 item 14: they name folders and a Hub repo id)."""

from __future__ import annotations

import random

import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.errors import BadRequest
from reef_lab.gateway.gateway import Gateway
from reef_lab.publishing.hub import HubConfig
from reef_lab.scenarios import NEW_NAME_MAX, check_name
from tests.conftest import Running

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
