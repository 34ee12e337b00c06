"""What the lowest role can make the server hold (issue 50 item 2): an agent token scoped to `team-*` created a
scenario with every new name it sent a call to (600 in 39 s), each with a learner holding threads (23 -> 1,223 with
the GEPA deployment recipe). The deployment and each scoped token now have a limit (403 naming it), and a scenario
with nothing to learn holds no thread: a learner's thread starts with work and ends when idle."""

from __future__ import annotations

import threading
import time

import pytest
import requests
import yaml

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning import loop
from reef_lab.publishing.tracking import TrackingConfig
from reef_lab.scenarios import ScenarioLimits
from reef_lab.tenants import Tenants, digest
from tests.conftest import Running

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
TOKENS = {"agent": "tok-agent", "other": "tok-other"}


def chat(url, token, scenario):
    return requests.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30,
                         headers={"Authorization": f"Bearer {token}", "x-reef-scenario": scenario})


@pytest.fixture
def limited(tmp_path, stub_url):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        {"sha256": digest(TOKENS["agent"]), "role": "agent", "scenarios": ["team-*"]},
        {"sha256": digest(TOKENS["other"]), "role": "admin", "scenarios": ["team-*"]}]}))
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, model="m", timeout=5.0), default_recipe="gepa",
                 scenario_limits=ScenarioLimits(total=6, per_token=3))
    r = Running(gw, Tenants.load(["root"], tokens))
    yield r
    r.stop()


def test_a_scoped_token_creates_at_most_its_share_and_the_deployment_at_most_its_total(limited):
    url = limited.url
    assert [chat(url, TOKENS["agent"], f"team-{i}").status_code for i in range(3)] == [200, 200, 200]
    no = chat(url, TOKENS["agent"], "team-3")
    assert no.status_code == 403 and "--max-scenarios-per-token 3" in no.json()["error"]["message"], no.text
    assert not limited.gateway.scenarios.exists("team-3")
    assert chat(url, TOKENS["agent"], "team-0").status_code == 200  # its existing scenarios still serve
    # every way a scenario is made counts: a report, an import, a publish, an explicit creation
    admin = {"Authorization": f"Bearer {TOKENS['other']}"}
    made = [requests.post(f"{url}/reef/scenarios", json={"name": "team-b0"}, headers=admin, timeout=30),
            requests.post(f"{url}/reef/scenarios/team-b1/harness", json={"files": {"system_prompt.md": "x"}},
                          headers=admin, timeout=30),
            requests.post(f"{url}/reef/records/batch", json={"records": [{"scenario": "team-b2"}]},
                          headers=admin, timeout=30)]
    assert [r.status_code for r in made] == [201, 201, 201], [r.text for r in made]
    for no in (requests.post(f"{url}/reef/report", json={"score": 1.0}, timeout=30,
                             headers={**admin, "x-reef-scenario": "team-b3"}),
               requests.post(f"{url}/reef/scenarios", json={"name": "team-b3"}, headers=admin, timeout=30)):
        assert no.status_code == 403 and "--max-scenarios" in no.json()["error"]["message"], no.text
    # the deployment's total binds every token, an admin of every scenario too (which has no share of its own)
    no = chat(url, "root", "root-1")
    assert no.status_code == 403 and "--max-scenarios 6" in no.json()["error"]["message"], no.text
    assert requests.delete(f"{url}/reef/scenarios/team-0", headers=admin, timeout=30).status_code == 200
    assert chat(url, "root", "root-1").status_code == 200  # room again
    assert chat(url, TOKENS["agent"], "team-3").status_code == 403  # total full again: 6 of 6
    assert len(limited.gateway.scenarios.list()) == 6


def test_an_idle_scenario_holds_no_thread(tmp_path, stub_url, monkeypatch):
    """GEPA scenarios (their seed harness serves from the first call, so each has a learner from the start):
    before, two threads each (the search's and the change requests'), three with W&B tracking (its run's); now none
    until there is work."""
    monkeypatch.setattr(loop, "IDLE_EXIT_S", 0.5)
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, model="m", timeout=5.0), default_recipe="gepa",
                 default_config={"mode": "manual", "search": {"minibatch_size": 1}},
                 tracking=TrackingConfig(mode="offline"))
    r = Running(gw)
    try:
        def threads():
            return sum(1 for t in threading.enumerate()
                       if t.name.startswith(("reef-gepa-", "reef-requests-", "reef-wandb-")))
        for i in range(40):
            assert chat(r.url, "", f"s{i}").status_code == 200
        assert len(gw.learners.built()) == 40 and threads() == 0
        # work starts the scenario's thread; it ends once idle, and starts again with the next work
        receipt = chat(r.url, "", "s0").headers["x-reef-agent-record-id"]
        rep = requests.post(f"{r.url}/reef/report", headers={"x-reef-scenario": "s0"}, timeout=30,
                            json={"score": 1.0, "references": [receipt], "metadata": {"answer": "2"}})
        assert rep.status_code == 200, rep.text
        ln = gw.learner("s0")
        assert ln.wait_idle(30) and ln.status()["examples"] == 1
        deadline = time.time() + 30
        while any(t.name.startswith("reef-gepa-") for t in threading.enumerate()) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(t.name.startswith("reef-gepa-") for t in threading.enumerate())
        train = requests.post(f"{r.url}/reef/train", headers={"x-reef-scenario": "s0"}, timeout=30)
        assert train.status_code == 202, train.text
        assert ln.wait_idle(60) and ln.rounds == 1, ln.status()
    finally:
        r.stop()
    # a restart builds every scenario's learner again (their harness serves), still without a thread each
    again = Gateway(tmp_path / "data", UpstreamEngine(stub_url, model="m", timeout=5.0), default_recipe="gepa",
                    tracking=TrackingConfig(mode="offline"))
    try:
        assert len(again.learners.built()) == 40 and threads() == 0
    finally:
        again.close()
