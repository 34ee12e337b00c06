"""Harness releases: a file tree published, applied in front of each dialect's instructions, named on records and
headers, served to clients by GET /reef/harness, rolled back; and pushed to the Hub as a tagged file tree."""

from __future__ import annotations

import json

import requests
from anthropic import Anthropic
from openai import OpenAI

from reef_lab.wire import dialects
from reef_lab.harness.tree import system_text
from reef_lab.wire.dialects import with_system as apply

FILES = {"system_prompt.md": "You are terse.", "rules.md": "- Answer with a number.",
         "skills/add.md": "Add digit by digit.", "notes/why.txt": "kept, served, not applied"}


def test_system_text_and_apply_per_dialect():
    text = system_text(FILES)
    assert text == ("You are terse.\n\nRules:\n- Answer with a number.\n\nSkills:\n## add\nAdd digit by digit.")
    chat = {"messages": [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]}
    out = apply(dialects.OPENAI_CHAT, chat, text)
    assert out["messages"][0] == {"role": "system", "content": text} and out["messages"][1:] == chat["messages"]
    assert len(chat["messages"]) == 2  # the client's body is not touched
    assert apply(dialects.OPENAI_RESPONSES, {"input": "hi", "instructions": "mine"}, text)["instructions"] == (
        text + "\n\nmine")
    assert apply(dialects.ANTHROPIC, {"messages": []}, text)["system"] == text
    blocks = apply(dialects.ANTHROPIC, {"system": [{"type": "text", "text": "mine"}]}, text)["system"]
    assert blocks == [{"type": "text", "text": text}, {"type": "text", "text": "mine"}]


def test_harness_release_served_through_a_provider(proxy):
    u = proxy.url
    bad = requests.post(u + "/reef/scenarios/h/harness", json={"files": {"../x": "no"}})
    assert bad.status_code == 400 and "relative path" in bad.json()["error"]["message"]
    r = requests.get(u + "/reef/harness", headers={"x-reef-scenario": "h"})
    assert r.status_code == 404  # the scenario (or its harness) does not exist yet
    r = requests.post(u + "/reef/scenarios/h/harness", json={"files": FILES})
    assert r.status_code == 201 and r.json()["release_id"] == "h:v1"
    got = requests.get(u + "/reef/harness", headers={"x-reef-scenario": "h"}).json()
    assert got == {"scenario": "h", "release_id": "h:v1", "files": FILES}

    # the stub provider echoes the system text it received: the harness went upstream in front of the client's
    client = OpenAI(base_url=u + "/v1", api_key="x", default_headers={"x-reef-scenario": "h"})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-reef-release-id"] == "h:v1"
    rec = requests.get(f"{u}/reef/scenarios/h/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert rec["release_id"] == "h:v1" and rec["request"]["messages"] == [{"role": "user", "content": "hi"}]
    # the stub answers `!system` with the system text it received: the harness went upstream, in each dialect
    text = system_text(FILES)
    ans = client.chat.completions.create(model="m", messages=[{"role": "system", "content": "mine"},
                                                              {"role": "user", "content": "!system"}])
    assert ans.choices[0].message.content == f"system: {text}\nmine"
    resp = client.responses.create(model="m", input=[{"role": "user", "content": "!system"}], instructions="own")
    assert resp.output_text == f"system: {text}\n\nown"
    msg = Anthropic(base_url=u, api_key="x", default_headers={"x-reef-scenario": "h"}).messages.with_raw_response
    raw = msg.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "!system"}])
    assert raw.headers["x-reef-release-id"] == "h:v1"
    assert raw.parse().content[0].text == f"system: {text}"

    # a second release, then a rollback to v1 and to none
    requests.post(u + "/reef/scenarios/h/harness", json={"files": {"system_prompt.md": "v2"}}).raise_for_status()
    assert requests.get(u + "/reef/harness", headers={"x-reef-scenario": "h"}).json()["release_id"] == "h:v2"
    old = requests.get(u + "/reef/harness?release_id=v1", headers={"x-reef-scenario": "h"}).json()
    assert old["files"] == FILES
    r = requests.post(u + "/reef/scenarios/h/rollback", json={"release_id": "v1"})
    assert r.status_code == 200 and r.json()["serving"] == "h:v1"
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-reef-release-id"] == "h:v1"
    requests.post(u + "/reef/scenarios/h/rollback", json={"release_id": "base"}).raise_for_status()
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert raw.headers["x-reef-release-id"] == "upstream"
    rels = requests.get(u + "/reef/scenarios/h/releases").json()
    assert [(r["version"], r["kind"], r["parent"]) for r in rels["releases"]] == [
        ("v1", "harness", "base"), ("v2", "harness", "h:v1")]
    assert json.dumps(rels)  # serialisable as the API returns it


def test_a_client_carrying_its_installed_release_gets_no_second_copy(proxy):
    """x-reef-harness: the client has that release in its own files (harness/install): not applied again, and the
    record names it; a value that names no release of this scenario is refused."""
    u = proxy.url
    requests.post(u + "/reef/scenarios/h/harness", json={"files": FILES}).raise_for_status()
    requests.post(u + "/reef/scenarios/h/harness", json={"files": {"rules.md": "v2 rules"}}).raise_for_status()
    client = OpenAI(base_url=u + "/v1", api_key="x", default_headers={"x-reef-scenario": "h",
                                                                      "x-reef-harness": "h:v1"})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[
        {"role": "system", "content": "mine"}, {"role": "user", "content": "!system"}])
    assert raw.parse().choices[0].message.content == "system: mine"  # the stub echoes the system text it got
    assert raw.headers["x-reef-release-id"] == "h:v1"
    rec = requests.get(f"{u}/reef/scenarios/h/records/{raw.headers['x-reef-agent-record-id']}").json()
    assert rec["release_id"] == "h:v1"
    for bad in ("other:v1", "h:v0", "h:latest", "h"):
        r = requests.post(u + "/v1/chat/completions", headers={"x-reef-scenario": "h", "x-reef-harness": bad},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "x-reef-harness must name a harness release" in r.json()["error"]["message"]
