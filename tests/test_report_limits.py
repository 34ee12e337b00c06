"""Every way a report enters passes the same checks, its scenario's recipe's included, and every string a client
sets in a config has a bound (issue 50, item 1): the live route, an import (POST /reef/records/batch), a report on
an episode, a composite's components, and a report stored by an earlier version, which the learner refuses at
intake. On the tiny random-init Llama, over HTTP on loopback."""

from __future__ import annotations

import requests

from reef_lab.records.record import Record
from reef_lab.schema import CLIENT_CONFIG_BYTES, CLIENT_MAX_CHARS
from reef_lab.tasks.base import make_task
from tests.conftest import Running
from tests.test_learning import TRAINER, ask, gateway  # noqa: F401 - the fixture

SDFT = {"recipe": "sdft", "config": {"batch_size": 100, "max_context_chars": 4000, "trainer": TRAINER}}


def _import(url: str, records: list[dict]) -> requests.Response:
    return requests.post(f"{url}/reef/records/batch", json={"records": records}, timeout=60)


def test_an_import_passes_the_recipes_report_check(gateway):
    """A report imported into an sdft scenario is held to its max_context_chars, in `context` and in feedback's
    words alike, and a context-less report is refused as on the live route; nothing of a refused batch is stored."""
    gateway.create_scenario({"name": "c", **SDFT})
    receipt, _, _ = ask(gateway, "c", make_task().items(1, seed=1)[0])
    r = Running(gateway)
    try:
        for words in ({"context": "x" * 32_000}, {"feedback": {"context": "y" * 1_000_000}},
                      {"feedback": "z" * 4001}):
            no = _import(r.url, [{"scenario": "c", "kind": "report", "references": [receipt], **words}])
            assert no.status_code == 400, no.text[:300]
            assert "records[0]" in no.json()["error"]["message"] and "at most 4000" in no.json()["error"]["message"]
        no = _import(r.url, [{"scenario": "c", "kind": "report", "references": [receipt], "score": 1.0}])
        assert no.status_code == 400 and "learns from the words of a report" in no.json()["error"]["message"]
        # a good record beside a bad one: all or nothing
        no = _import(r.url, [{"scenario": "c", "kind": "report", "references": [receipt], "context": "It is 2."},
                             {"scenario": "c", "kind": "report", "references": [receipt], "context": "w" * 4001}])
        assert no.status_code == 400 and "records[1]" in no.json()["error"]["message"], no.text[:300]
        assert gateway.list_records("c", kind="report")["records"] == []
        ok = _import(r.url, [{"scenario": "c", "kind": "report", "references": [receipt], "context": "It is 2."}])
        assert ok.status_code == 201, ok.text[:300]
    finally:
        r.server.shutdown()  # the fixture closes the gateway


def test_a_report_on_an_episode_and_a_composites_pass_the_check(gateway):
    gateway.create_scenario({"name": "c", **SDFT})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    gateway.infer_record(body, "c", session="ep-1")
    r = Running(gateway)
    try:
        no = requests.post(f"{r.url}/reef/report", headers={"x-reef-scenario": "c"}, timeout=60,
                           json={"episode": "ep-1", "context": "v" * 4001})
        assert no.status_code == 400 and "at most 4000" in no.json()["error"]["message"], no.text[:300]
        ok = requests.post(f"{r.url}/reef/report", headers={"x-reef-scenario": "c"}, timeout=60,
                           json={"episode": "ep-1", "context": "Say hello back."})
        assert ok.status_code == 200, ok.text[:300]
        # a composite whose weights component is sdft: its components' checks hold, on import too
        gateway.create_scenario({"name": "k", "recipe": "composite", "config": {"components": {
            "weights": {"recipe": "sdft", "config": {"max_context_chars": 100, "trainer": TRAINER}}}}})
        receipt, _, _ = ask(gateway, "k", make_task().items(1, seed=1)[0])
        no = _import(r.url, [{"scenario": "k", "kind": "report", "references": [receipt], "context": "u" * 101}])
        assert no.status_code == 400 and "at most 100" in no.json()["error"]["message"], no.text[:300]
    finally:
        r.server.shutdown()


def test_the_learner_refuses_a_stored_report_that_breaks_its_recipes_check(gateway):
    """A report stored without the recipe's check (an earlier version's import) is failed at the learner's intake
    with the check's message, never handed to the teacher."""
    gateway.create_scenario({"name": "c", **SDFT})
    receipt, _, _ = ask(gateway, "c", make_task().items(1, seed=1)[0])
    old = Record(id="old-report", scenario="c", kind="report", references=[receipt], context="q" * 20_000)
    gateway.store.append([old])
    gateway.learners.start("c", old.to_dict())
    ln = gateway.learner("c")
    assert ln.wait_idle(120)
    failed = {f["record"]: f["error"] for f in ln.status()["failed"]}
    assert "at most 4000" in failed["old-report"], failed
    assert ln.status()["pool"] == 0


def test_every_string_a_client_sets_in_a_config_is_bounded(gateway):
    r = Running(gateway)
    try:
        def create(name, recipe, config):
            return requests.post(f"{r.url}/reef/scenarios", timeout=60,
                                 json={"name": name, "recipe": recipe, "config": config})
        no = create("t", "sdft", {"context_template": "{context}" + "t" * 5_000_000})
        assert no.status_code in (400, 413), no.text[:300]  # 5 MB: past the body's or the string's limit
        no = create("t", "sdft", {"context_template": "{context}" + "t" * CLIENT_MAX_CHARS})
        msg = no.json()["error"]["message"]
        assert no.status_code == 400 and "config.context_template is" in msg, no.text[:300]
        assert f"at most {CLIENT_MAX_CHARS}" in msg
        no = create("t", "sft", {"eval_task": {"name": "arithmetic", "system_prompt": "s" * (CLIENT_MAX_CHARS + 1)}})
        assert no.status_code == 400 and "config.eval_task.system_prompt" in no.json()["error"]["message"]
        # a field with its own bound (a harness file) takes more, and the whole config is bounded too
        ok = create("g1", "gepa", {"seed_harness": {"AGENTS.md": "a" * 10_000}})
        assert ok.status_code == 201, ok.text[:300]
        no = create("g2", "gepa", {"seed_harness": {f"f{i}.md": "a" * 100_000 for i in range(3)}})
        assert no.status_code == 400 and f"at most {CLIENT_CONFIG_BYTES}" in no.json()["error"]["message"]
        ok = create("t", "sdft", {"context_template": "Words: {context}"})
        assert ok.status_code == 201, ok.text[:300]
        assert [s["name"] for s in requests.get(f"{r.url}/reef/scenarios", timeout=30).json()["scenarios"]] == \
            ["g1", "t"]
    finally:
        r.server.shutdown()
