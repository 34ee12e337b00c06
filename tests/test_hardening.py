"""What a hostile or careless client, and a mistyped deployment, meet: a regression test per defect found from
outside (code named by a client, cross-site requests, body size and nesting, wrong types, harness paths, provider
faults, recipe configs, a data dir whose scenarios name recipes this deployment does not offer)."""

from __future__ import annotations

import json

import orjson
import polars as pl
import pytest
import requests

from reef_lab.config import parse_serve_config
from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.records.store import scan_records
from tests.conftest import Running

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def post(url, path, body=None, scenario="h", **headers):
    h = {"Content-Type": "application/json", **headers}
    if scenario is not None:
        h["x-reef-scenario"] = scenario
    return requests.post(url + path, data=json.dumps(body), headers=h, timeout=30)  # json: orjson stops at 254


def test_a_client_cannot_name_code_to_import(proxy, tmp_path):
    marker = tmp_path / "pwned"
    body = {"name": "x", "recipe": "subprocess:Popen", "config": {"args": ["touch", str(marker)]}}
    r = post(proxy.url, "/reef/scenarios", body)
    assert r.status_code == 400 and "not offered" in r.json()["error"]["message"]
    for recipe in ("os:system", "reef_lab.testing.stub_provider:app", "../x", "recipes.sft:Recipe"):
        assert post(proxy.url, "/reef/scenarios", {"name": "y", "recipe": recipe}).status_code == 400
    assert post(proxy.url, "/reef/scenarios", {"name": "z", "recipe": 1}).status_code == 400
    assert not marker.exists()
    assert requests.get(proxy.url + "/reef/scenarios").json()["scenarios"] == []
    assert post(proxy.url, "/reef/scenarios", {"name": "ok", "recipe": "basic"}).status_code == 201  # shipped


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_bodies_must_be_json_so_no_web_page_can_send_a_simple_request(proxy, tmp_path, content_type):
    marker = tmp_path / "pwned"
    raw = json.dumps({"name": "x", "recipe": "subprocess:Popen", "config": {"args": ["touch", str(marker)]}})
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = requests.post(proxy.url + "/reef/scenarios", data=raw, headers=headers)
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = requests.post(proxy.url + "/v1/chat/completions", data=json.dumps(CHAT),
                      headers={**headers, "x-reef-scenario": "h"})
    assert r.status_code == 415
    assert not marker.exists() and requests.get(proxy.url + "/reef/scenarios").json()["scenarios"] == []


def test_browser_pages_of_other_sites_are_refused_while_auth_is_off(proxy):
    for h in ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, {"Origin": "null"},
              {"Sec-Fetch-Site": "same-site"}, {"Origin": "http://127.0.0.1:1"}):
        r = post(proxy.url, "/v1/chat/completions", CHAT, **h)
        assert r.status_code == 403 and "REEF_TOKEN" in r.json()["error"]["message"], h
        assert requests.get(proxy.url + "/reef/status", headers=h).status_code == 403
    host = proxy.url.removeprefix("http://")
    ok = post(proxy.url, "/v1/chat/completions", CHAT, Origin=f"http://{host}", **{"Sec-Fetch-Site": "same-origin"})
    assert ok.status_code == 200  # a page of this server itself, and every non-browser client, still work


def test_with_a_token_the_token_decides(serve, stub_url):
    s = serve(UpstreamEngine(stub_url, timeout=2.0), tokens=["sekret"])
    h = {"Authorization": "Bearer sekret", "Origin": "http://elsewhere.example"}
    assert post(s.url, "/v1/chat/completions", CHAT, **h).status_code == 200
    assert post(s.url, "/v1/chat/completions", CHAT, Origin="http://elsewhere.example").status_code == 401


def nested(depth: int, leaf=1):
    out = leaf
    for _ in range(depth - 1):
        out = [out]
    return out


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {**CHAT, "model": nested(300)}),
    ("/v1/chat/completions", {**CHAT, "stream": True, "model": nested(300)}),
    ("/v1/messages", {**CHAT, "max_tokens": 5, "metadata": nested(900)}),
    ("/reef/report", {"score": 1, "feedback": {"x": nested(255)}}),
    ("/reef/records/batch", {"records": [{"scenario": "h", "kind": nested(500)}]}),
    ("/reef/scenarios", {"name": "d", "config": {"x": nested(100)}}),
])
def test_deep_json_is_a_400_naming_the_limit(proxy, path, body):
    r = post(proxy.url, path, body)
    assert r.status_code == 400 and "deeper than 64" in r.text, r.text
    assert post(proxy.url, path, nested(60)).status_code == 400  # within the limit: refused for its shape


def test_bodies_over_the_limits_are_413(proxy):
    r = post(proxy.url, "/reef/report", {"score": 1, "feedback": "x" * (1 << 20)})
    assert r.status_code == 413 and "/reef/report takes at most 1 MB" in r.json()["error"]["message"]
    r = post(proxy.url, "/v1/chat/completions", {**CHAT, "pad": "x" * (11 << 20)})
    assert r.status_code == 413
    # chunked (no Content-Length): read up to the limit, then refused
    r = requests.post(proxy.url + "/reef/report", data=iter([b'{"score": 1, "feedback": "', b"x" * (2 << 20), b'"}']),
                      headers={"Content-Type": "application/json", "x-reef-scenario": "h"})
    assert r.status_code == 413
    assert scan_records(proxy.gateway.data_dir).collect().height == 0  # nothing was recorded


@pytest.mark.parametrize("path,body,field", [
    ("/v1/messages/count_tokens", [1, 2], "JSON object"),
    ("/reef/train", {"scenario": 1}, "scenario name must be a string"),
    ("/reef/records/batch", {"records": [{"scenario": "h", "kind": {"a": 1}}]}, "'kind'"),
    ("/reef/records/batch", {"records": [{"scenario": "h", "timing": 3}]}, "'timing'"),
    ("/reef/records/batch", {"records": [{"scenario": "h", "release_id": ["x"]}]}, "'release_id'"),
    ("/reef/records/batch", {"records": [{"scenario": "h", "token_ids": [2**63]}]}, "token ids"),
    ("/reef/scenarios", {"name": "n", "recipe": "basic", "extra": 1}, "unknown field"),
    ("/reef/report", {"score": "1"}, "'score'"),
    ("/reef/scenarios/h/rollback", {"release_id": 3}, "release_id"),
    ("/reef/scenarios/h/promote", {"candidate": None}, "candidate"),
])
def test_wrong_types_are_400_naming_the_field(proxy, path, body, field):
    post(proxy.url, "/v1/chat/completions", CHAT)  # scenario h exists
    r = post(proxy.url, path, body, scenario="h" if path == "/reef/report" else None)
    assert r.status_code == 400 and field in r.text, r.text


def test_bad_harness_paths_are_400_and_leave_no_candidate(proxy):
    for files in ({"a" * 300: "x"}, {"a\x00b": "x"}, {"a": "x", "a/b": "y"}, {"../up": "x"}, {"/abs": "x"},
                  {"README.md": "x"}, {"a//b": "x"}):
        r = post(proxy.url, "/reef/scenarios/h/harness", {"files": files})
        assert r.status_code == 400 and "harness path" in r.json()["error"]["message"], files
    rel = requests.get(proxy.url + "/reef/scenarios/h/releases").json()
    assert rel["candidates"] == [] and rel["releases"] == []
    assert post(proxy.url, "/reef/scenarios/h/harness", {"files": {"skills/a.md": "x"}}).status_code == 201


def test_non_list_messages_in_a_harness_scenario_are_400(proxy):
    assert post(proxy.url, "/reef/scenarios/h/harness", {"files": {"system_prompt.md": "Be brief."}}).status_code == 201
    for messages in ("hi", {"role": "user"}, 5):
        r = post(proxy.url, "/v1/chat/completions", {**CHAT, "messages": messages})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]


def records(proxy):
    return scan_records(proxy.gateway.data_dir).filter(pl.col("kind") == "inference").collect()


def test_a_provider_200_that_is_not_json_is_a_recorded_502(proxy):
    r = post(proxy.url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "!notjson"}]})
    assert r.status_code == 502 and "not JSON" in r.json()["error"]["message"]
    rec = records(proxy).row(0, named=True)
    assert rec["status"] == "error" and "not JSON" in rec["error"] and "gateway hiccup" in rec["response"]


def test_a_429_and_its_retry_after_reach_the_client(proxy):
    r = post(proxy.url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "!429"}]})
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.headers["x-ratelimit-remaining-requests"] == "0" and r.headers["x-reef-agent-record-id"]
    stream = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "!429"}]}
    r = post(proxy.url, "/v1/chat/completions", stream)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert records(proxy)["status"].to_list() == ["refused", "refused"]  # a 4xx of the provider: refused


@pytest.mark.parametrize("how", ["500", "unreachable", "timeout"])
def test_a_stream_that_fails_before_its_first_byte_is_recorded(serve, stub_url, how):
    url = "http://127.0.0.1:9" if how == "unreachable" else stub_url
    s = serve(UpstreamEngine(url, timeout=0.5))
    content = {"500": "!500", "unreachable": "hi", "timeout": "!sleep=2"}[how]
    r = post(s.url, "/v1/chat/completions", {**CHAT, "stream": True, "messages": [{"role": "user",
                                                                                    "content": content}]})
    assert r.status_code == (504 if how == "timeout" else 502)
    rec = records(s).row(0, named=True)
    assert rec["status"] == "error" and rec["error"]


def test_a_mistyped_nested_recipe_config_is_refused_at_start_with_its_path(tmp_path, capsys):
    cfg = tmp_path / "sft.yaml"
    for text, needle in [("eval_task: {name: arithmatic}\n", "eval_task: task name must be"),
                         ("trainer: {lrr: 1.0e-5}\n", "trainer.lrr is not a TrainerConfig field"),
                         ("trainer: {lr: 1e-5}\n", "trainer.lr must be a number"),
                         ("batch_size: eight\n", "batch_size must be an integer")]:
        cfg.write_text(text)
        with pytest.raises(SystemExit):
            parse_serve_config(["--recipe", "sft", "--recipe-config", str(cfg), "--data-dir", str(tmp_path)])
        assert needle in capsys.readouterr().err


def test_a_data_dir_naming_recipes_this_deployment_does_not_offer_still_serves(tmp_path, stub_url):
    """scenarios.json written by an older version (a client-chosen module:Class) or with a config this version
    refuses: the server starts, nothing is imported, the scenarios serve and record, /reef/status says why they
    do not learn, and reports are stored and answered 200."""
    data, marker = tmp_path / "data", tmp_path / "pwned"
    data.mkdir()
    (data / "scenarios.json").write_bytes(orjson.dumps([
        {"name": "evil", "recipe": "subprocess:Popen", "created_at": 1.0, "config": {"args": ["touch", str(marker)]}},
        {"name": "typo", "recipe": "sft", "created_at": 1.0, "config": {"eval_task": {"name": "arithmatic"}}}]))
    s = Running(Gateway(data, UpstreamEngine(stub_url, timeout=2.0)))
    try:
        errors = requests.get(s.url + "/reef/status").json()["scenario_errors"]
        assert "not offered" in errors["evil"] and "arithmatic" in errors["typo"]
        assert not marker.exists()
        for name in ("evil", "typo"):
            r = post(s.url, "/v1/chat/completions", CHAT, scenario=name)
            assert r.status_code == 200
            rep = post(s.url, "/reef/report", {"score": 1, "references": [r.headers["x-reef-agent-record-id"]]},
                       scenario=name)
            assert rep.status_code == 200, rep.text
            assert requests.get(s.url + f"/reef/scenarios/{name}").json()["error"]
        assert post(s.url, "/reef/train", {"scenario": "typo"}, scenario=None).status_code == 409
    finally:
        s.stop()
    assert not marker.exists()


@pytest.mark.parametrize("config,field", [
    ({"task_lm": {"kind": "openai", "base_url": "http://attacker.example", "model": "m", "key_env": "REEF_TOKEN"}},
     "config.task_lm"),
    ({"reflection_lm": {"kind": "engine", "record": "/tmp/cassette.jsonl"}}, "config.reflection_lm"),
    ({"val_task": {"name": "jsonl", "path": "/etc/passwd"}}, "config.val_task.path"),
])
def test_a_client_config_cannot_set_files_endpoints_or_keys(proxy, config, field):
    """Fields that read or write files, or send an environment variable's value to an endpoint, are the operator's
    (--recipe-config): a client that sets them is refused and nothing is created."""
    r = post(proxy.url, "/reef/scenarios", {"name": "g", "recipe": "gepa", "config": config})
    assert r.status_code == 400 and f"{field} can be set only by the server's operator" in r.text, r.text
    assert requests.get(proxy.url + "/reef/scenarios").json()["scenarios"] == []
