"""apps/harness.py in-process (`app.run()`) over a data dir a live server wrote: the release chain with each
change's request, verdict and diff, and the requests in flight. The browser test is in tests/test_apps_browser.py."""

from __future__ import annotations

import time

import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.testing.scripted_provider import ScriptedProvider
from tests.conftest import Running
from tests.test_apps import load_module

SEED = {"system_prompt.md": "Be careful.", "rules.md": "- RULE-ONE\n"}


def harness_data(data, selection: str = "review", texts=("Always write a CHANGELOG entry", "please REEF-REJECT",
                                                         "Name the tests you ran")):
    """A data dir with a gepa scenario `s`, its seed and one change request per text (each settled)."""
    with ScriptedProvider() as p:
        cfg = {"mode": "manual", "seed_harness": SEED, "requests": {
            "selection": selection, "proposer_lm": {"kind": "openai", "base_url": p.url, "model": "scripted"}}}
        s = Running(Gateway(data, UpstreamEngine(p.url, model="m"), default_recipe="gepa", default_config=cfg))
        try:
            requests.post(s.url + "/reef/scenarios", json={"name": "s"}).raise_for_status()
            ids = []
            for text in texts:
                rid = requests.post(s.url + "/reef/train", headers={"x-reef-scenario": "s"},
                                    json={"text": text}).json()["request_id"]
                deadline = time.time() + 60
                while requests.get(f"{s.url}/reef/requests/{rid}").json()["state"] not in (
                        "released", "rejected", "pending_review") and time.time() < deadline:
                    time.sleep(0.05)
                ids.append(rid)
            return ids
        finally:
            s.stop()


@pytest.fixture
def harness_app(monkeypatch):
    def run(data):
        monkeypatch.setenv("REEF_LAB_DATA_DIR", str(data))
        mod = load_module("harness")
        _, env = mod.app.run()
        return mod, env
    return run


def test_harness_app_shows_the_chain_with_requests_verdicts_and_diffs(tmp_path, harness_app):
    data = tmp_path / "data"
    ids = harness_data(data)
    mod, env = harness_app(data)
    assert env["scenario_names"] == ["s"] and env["version_select"].value == "v3"
    view = env["view"]
    chain = mod.chain_html(view)
    assert chain.index("data-version='v3'") < chain.index("data-version='v2'") < chain.index("data-version='v1'")
    assert "<b>v3</b> <b>serving</b>" in chain and "request: Name the tests you ran" in chain
    assert "request: Always write a CHANGELOG entry" in chain and "the recipe&#x27;s seed harness" in chain
    assert chain.count("review: scripted review") == 2 and "not pushed" in chain
    diff = mod.release_diff(view, "v3")
    assert "+- Name the tests you ran" in diff and "--- /dev/null" in diff and "+++ v3/skills/req-" in diff
    assert "+- Always write" not in diff and " - Always write a CHANGELOG entry" in diff  # v2: context
    everything = mod.requests_frame(view)
    assert everything["id"].to_list() == ids[::-1]
    assert everything["state"].to_list() == ["released", "rejected", "released"]
    assert everything.row(1, named=True)["why"] == "review: scripted review"
    assert mod.requests_frame(view, only_open=True).height == 0
    card = mod.request_html(next(r for r in view["requests"] if r["id"] == ids[0]))
    assert "Always write a CHANGELOG entry" in card and "released" in card and "add rule" in card


def test_harness_app_lists_a_request_waiting_for_a_person(tmp_path, harness_app):
    data = tmp_path / "data"
    (rid,) = harness_data(data, selection="promote", texts=("Prefer small commits",))
    mod, env = harness_app(data)
    flight = mod.requests_frame(env["view"], only_open=True)
    assert flight["id"].to_list() == [rid] and flight["state"].to_list() == ["pending_review"]
    assert "promote" in flight["why"][0]


def test_harness_app_says_when_there_is_nothing_to_show(tmp_path, harness_app):
    mod, env = harness_app(tmp_path / "nothing")
    assert env["scenario_names"] == [] and env["view"] is None
