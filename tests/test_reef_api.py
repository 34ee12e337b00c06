"""reef_lab's own API: reports and their validation, auth, scenarios, records, import, status."""

import pytest
import requests

from reef_lab.engines.upstream import UpstreamEngine


def infer(url, scenario="demo", text="hi", headers=None):
    h = {"x-reef-scenario": scenario, **(headers or {})}
    r = requests.post(url + "/v1/chat/completions", headers=h,
                      json={"model": "m", "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def report(url, body, scenario="demo", raw=None):
    h = {"x-reef-scenario": scenario} if scenario else {}
    if raw is not None:
        return requests.post(url + "/reef/report", data=raw, headers={**h, "Content-Type": "application/json"})
    return requests.post(url + "/reef/report", json=body, headers=h)


def test_report_with_references_is_stored(proxy):
    a, b = infer(proxy.url), infer(proxy.url)
    r = report(proxy.url, {"score": 0.5, "feedback": {"why": "ok"}, "references": [a, b], "metadata": {"k": 1}})
    assert r.status_code == 200  # Reef's answer: 200 with the report's own receipt
    assert r.json()["scenario"] == "demo" and r.json()["request_type"] == "report" and r.json()["created"]
    rec = proxy.gateway.store.get(r.json()["agent_record_id"])
    assert rec["kind"] == "report" and rec["score"] == 0.5 and rec["references"] == [a, b]
    assert rec["feedback"] == {"why": "ok"} and rec["metadata"] == {"k": 1}


@pytest.mark.parametrize("body,raw,needle", [
    ({"score": True}, None, "'score' must be a finite number"),
    ({"score": "1"}, None, "'score' must be a finite number"),
    (None, b'{"score": NaN}', "not valid JSON"),
    (None, b'{"score": 1e999}', "not valid JSON"),
    (None, b"", "empty"),
    ([1, 2], None, "must be a JSON object"),
    ({}, None, "needs a 'score', 'feedback' or 'context'"),
    ({"score": 1, "feedback": 3}, None, "'feedback' must be a string or an object"),
    ({"score": 1, "references": "rec_x"}, None, "must be a list of receipts"),
    ({"score": 1, "references": ["rec_unknown"]}, None, "not a known receipt"),
    ({"score": 1, "metadata": [1]}, None, "'metadata' must be an object"),
    ({"score": 1, "extra": 1}, None, "unknown report field"),
])
def test_bad_reports_are_400_with_a_message(proxy, body, raw, needle):
    r = report(proxy.url, body, raw=raw)
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]


def test_report_reference_rules(proxy):
    a = infer(proxy.url, "demo")
    other = infer(proxy.url, "other")
    r = report(proxy.url, {"score": 1, "references": [a, a]})
    assert r.status_code == 400 and "more than once" in r.json()["error"]["message"]
    r = report(proxy.url, {"score": 1, "references": [other]})
    assert r.status_code == 400 and "belongs to another scenario, not 'demo'" in r.json()["error"]["message"]
    rep = report(proxy.url, {"score": 1, "references": [a]}).json()["agent_record_id"]
    r = report(proxy.url, {"score": 1, "references": [rep]})
    assert r.status_code == 400 and "is a report record" in r.json()["error"]["message"]
    r = report(proxy.url, {"score": 1}, scenario=None)
    assert r.status_code == 400 and "x-reef-scenario" in r.json()["error"]["message"]


def test_client_chosen_report_id_is_idempotent(proxy):
    a = infer(proxy.url)
    first = report(proxy.url, {"agent_record_id": "my-1", "score": 1, "references": [a]})
    assert first.status_code == 200 and first.json()["agent_record_id"] == "my-1" and first.json()["created"]
    again = report(proxy.url, {"agent_record_id": "my-1", "score": 1, "references": [a]})
    assert again.status_code == 200 and again.json()["created"] is False
    r = report(proxy.url, {"agent_record_id": "my-1", "score": 0, "references": [a]})
    assert r.status_code == 409 and "different content" in r.json()["error"]["message"]
    assert report(proxy.url, {"id": "my-2", "score": 1}).json()["agent_record_id"] == "my-2"
    r = report(proxy.url, {"agent_record_id": "", "score": 1})
    assert r.status_code == 400 and "invalid" in r.json()["error"]["message"]


def test_scenario_header_required_on_inference(proxy):
    r = requests.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                            "content": "x"}]})
    assert r.status_code == 400 and "x-reef-scenario" in r.json()["error"]["message"]
    r = requests.post(proxy.url + "/v1/messages", headers={"x-reef-scenario": "bad name!"},
                      json={"model": "m", "max_tokens": 5, "messages": []})
    assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's error shape on /v1/messages
    assert "invalid" in r.json()["error"]["message"]


def test_auth_tokens_bearer_and_x_api_key(serve, stub_url):
    p = serve(UpstreamEngine(stub_url), tokens=["tok-a", "tok-b"])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert requests.get(p.url + "/healthz").status_code == 200
    assert requests.get(p.url + "/reef/status").status_code == 401
    r = requests.post(p.url + "/v1/chat/completions", json=body, headers={"x-reef-scenario": "s",
                                                                         "Authorization": "Bearer nope"})
    assert r.status_code == 401 and "REEF_TOKEN" in r.json()["error"]["message"]
    for h in ({"Authorization": "Bearer tok-a"}, {"Authorization": "Bearer tok-b"}, {"x-api-key": "tok-b"}):
        r = requests.post(p.url + "/v1/chat/completions", json=body, headers={"x-reef-scenario": "s", **h})
        assert r.status_code == 200, h


def test_scenarios_crud_and_records_paging(proxy):
    u = proxy.url
    r = requests.post(u + "/reef/scenarios", json={"name": "made", "recipe": "basic"})
    assert r.status_code == 201 and r.json()["recipe"] == "basic"
    assert requests.post(u + "/reef/scenarios", json={"name": "made"}).status_code == 409
    r = requests.post(u + "/reef/scenarios", json={"name": "x2", "recipe": "nosuch"})
    assert r.status_code == 400 and "is not offered" in r.json()["error"]["message"]
    r = requests.post(u + "/reef/scenarios", json={"name": "x3", "recipe": "basic", "config": {"nope": 1}})
    assert r.status_code == 400 and "config does not fit" in r.json()["error"]["message"]
    ids = [infer(u, "made", f"m{i}") for i in range(5)]
    report(u, {"score": 1, "references": ids[:2]}, scenario="made")
    info = requests.get(u + "/reef/scenarios/made").json()
    assert info["records"] == {"inference": 5, "report": 1, "train": 0, "eval": 0}
    assert "made" in [s["name"] for s in requests.get(u + "/reef/scenarios").json()["scenarios"]]
    page = requests.get(u + "/reef/scenarios/made/records", params={"kind": "inference", "limit": 2}).json()
    seen = [r["id"] for r in page["records"]]
    while page["next"]:
        page = requests.get(u + "/reef/scenarios/made/records",
                            params={"kind": "inference", "limit": 2, "after": page["next"]}).json()
        seen += [r["id"] for r in page["records"]]
    assert seen == sorted(ids)
    one = requests.get(u + f"/reef/scenarios/made/records/{ids[0]}").json()
    assert one["request"]["messages"][0]["content"] == "m0"
    assert one["agent_record_id"] == ids[0] and one["artifact_ref"] == {"release_id": "upstream"}
    assert requests.get(u + f"/reef/scenarios/demo/records/{ids[0]}").status_code == 404
    assert requests.get(u + "/reef/scenarios/made/records", params={"limit": "x"}).status_code == 400
    assert requests.delete(u + "/reef/scenarios/made").json()["records_hidden"] == 6
    assert requests.get(u + "/reef/scenarios/made").status_code == 404
    assert report(u, {"score": 1, "references": [ids[0]]}, scenario="made").status_code == 400
    infer(u, "made")  # recreated by use, starts empty
    assert requests.get(u + "/reef/scenarios/made").json()["records"]["inference"] == 1


def test_batch_import_all_or_nothing(proxy):
    u = proxy.url
    good = [{"id": "imp-1", "scenario": "imp", "kind": "inference", "dialect": "openai.chat",
             "request": {"messages": []}, "response": {"x": 1}, "token_ids": [1, 2], "logprobs": [-0.1, -0.2]},
            {"id": "imp-2", "scenario": "imp", "kind": "report", "score": 1.0, "references": ["imp-1"]}]
    r = requests.post(u + "/reef/records/batch", json={"records": good})
    assert r.status_code == 201 and r.json()["created"] == 2
    assert requests.post(u + "/reef/records/batch", json={"records": good}).status_code == 200
    r = requests.post(u + "/reef/records/batch", data=b'{"records": [{"id": "imp-3", "scenario": "imp"}, '
                      b'{"id": "imp-4", "scenario": "imp", "kind": "bogus"}]}',
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "records[1]" in r.json()["error"]["message"]
    assert proxy.gateway.store.entry("imp-3") is None  # nothing of the failed batch was written
    r = requests.post(u + "/reef/records/batch", json={"records": [{**good[0], "response": {"x": 2}}]})
    assert r.status_code == 409
    old = requests.post(u + "/reef/records/batch", json={"records": [{"id": "imp-old", "scenario": "fresh",
                                                                      "created_at": 1_000_000_000.0}]})
    assert old.status_code == 201  # a record from the past, imported into a new scenario, is listed there
    assert [r["id"] for r in requests.get(u + "/reef/scenarios/fresh/records").json()["records"]] == ["imp-old"]
    r = requests.post(u + "/reef/records/batch", json={"records": [{"scenario": "imp", "token_ids": [1],
                                                                    "logprobs": []}]})
    assert r.status_code == 400 and "one entry per token" in r.json()["error"]["message"]


def test_status_and_unknown_route(proxy):
    infer(proxy.url)
    s = requests.get(proxy.url + "/reef/status").json()
    assert s["ok"] and s["store"]["records"] == 1 and s["engine"]["engine"] == "upstream"
    r = requests.get(proxy.url + "/nope")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = requests.get(proxy.url + "/v1/chat/completions", headers={"x-reef-scenario": "demo"})
    assert r.status_code == 405 and "use POST" in r.json()["error"]["message"]
