"""Tenants (reef_lab/tenants.py, server/access.py): every route x role over HTTP on a real server, the attack of
issue 38 item 3 (a second token against the first one's scenario and episode), the tokens file and its CLI, and the
check in every worker of a multi-worker server.

Tokens of the table: `agent`, `reader`, `admin` of `team-a-*`; `other`, an admin of `team-b-*` (a token of another
scenario, with every right there); `root`, a REEF_TOKEN admin of every scenario (sets up state).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import yaml

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.harness.change_requests import RequestStore
from reef_lab.records.store import read_log
from reef_lab.tenants import ROLES, Grant, Tenants, add_token, digest, read_tokens_file
from reef_lab.testing.processes import start_server
from server.access import HOT_ROUTES, ROUTES
from server.app import create_app
from server.common import legacy_tokens_warning
from tests.conftest import Running

ROOT = Path(__file__).resolve().parents[1]
A = "team-a-x"  # the scenario of the table's tokens
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TOKENS = {"agent": "tok-agent", "reader": "tok-reader", "admin": "tok-admin", "other": "tok-other"}


def tokens_file(path: Path, entries: dict[str, tuple[str, list[str]]]) -> Path:
    path.write_text(yaml.safe_dump({"tokens": [{"sha256": digest(tok), "role": role, "scenarios": scopes}
                                               for tok, (role, scopes) in entries.items()]}))
    return path


@pytest.fixture
def tenants_file(tmp_path):
    return tokens_file(tmp_path / "tokens.yaml", {
        TOKENS["agent"]: ("agent", ["team-a-*"]), TOKENS["reader"]: ("reader", ["team-a-*"]),
        TOKENS["admin"]: ("admin", ["team-a-*"]), TOKENS["other"]: ("admin", ["team-b-*"])})


@pytest.fixture
def server(tmp_path, stub_url, tenants_file):
    r = Running(Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=5.0)),
                Tenants.load(["root"], tenants_file))
    yield r
    r.stop()


def call(url, method, path, token=None, scenario=None, body=None, **params):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if scenario:
        headers["x-reef-scenario"] = scenario
    if body is not None:
        headers["Content-Type"] = "application/json"
    return requests.request(method, url + path, headers=headers, params=params or None,
                            data=None if body is None else json.dumps(body), timeout=30)


def infer(url, token, scenario=A, session=None, text="hi"):
    headers = {"Authorization": f"Bearer {token}", "x-reef-scenario": scenario,
               **({"x-reef-session": session} if session else {})}
    r = requests.post(url + "/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": text}]},
                      headers=headers, timeout=30)
    return r


def receipt(url, token, scenario=A, session=None, text="hi"):
    r = infer(url, token, scenario, session, text)
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


# ---- the table ----------------------------------------------------------------------------------------------------
# (method, rule) -> the least role that may call it on a scenario of its own; None: no token needed. Written here
# again on purpose (not read from server/access.py): a route added without a role, or a role changed there, fails.
EXPECTED = {
    ("GET", "/healthz"): None,
    ("POST", "/v1/chat/completions"): "agent",
    ("POST", "/v1/responses"): "agent",
    ("POST", "/v1/messages"): "agent",
    ("POST", "/reef/report"): "agent",
    ("POST", "/v1/messages/count_tokens"): "agent",
    ("GET", "/v1/models"): "agent",
    ("GET", "/reef/status"): "agent",
    ("GET", "/reef/scenarios"): "reader",
    ("GET", "/reef/scenarios/<name>"): "reader",
    ("GET", "/reef/scenarios/<name>/records"): "reader",
    ("GET", "/reef/scenarios/<name>/records/<record_id>"): "reader",
    ("GET", "/reef/scenarios/<name>/releases"): "reader",
    ("GET", "/reef/scenarios/<name>/requests"): "reader",
    ("GET", "/reef/requests/<request_id>"): "reader",
    ("GET", "/reef/harness"): "reader",
    ("GET", "/reef/harness/install"): "reader",
    ("GET", "/reef/episodes/<episode>"): "reader",
    ("GET", "/reef/scenarios/<name>/episodes/<episode>"): "reader",
    ("POST", "/reef/scenarios"): "admin",
    ("DELETE", "/reef/scenarios/<name>"): "admin",
    ("POST", "/reef/records/batch"): "admin",
    ("POST", "/reef/train"): "admin",
    ("POST", "/reef/scenarios/<name>/rollback"): "admin",
    ("POST", "/reef/scenarios/<name>/promote"): "admin",
    ("POST", "/reef/scenarios/<name>/harness"): "admin",
}
SCENARIO_FREE = {("GET", "/healthz"), ("POST", "/v1/messages/count_tokens"), ("GET", "/v1/models"),
                 ("GET", "/reef/status"), ("GET", "/reef/scenarios")}  # the `other` token may call these too


def app_routes(app) -> set[tuple[str, str]]:
    rules = {(m, r.rule) for r in app.url_map.iter_rules() if r.endpoint != "static"
             for m in r.methods - {"HEAD", "OPTIONS"}}
    return rules | {("POST", p) for p in HOT_ROUTES}


def test_every_route_of_the_app_has_a_role_here_and_in_server_access(server):
    app = create_app(server.gateway, ["x"])
    routes = app_routes(app)
    missing = routes - set(EXPECTED)
    assert not missing, f"routes without a role in this test's EXPECTED table (and server/access.py): {missing}"
    assert set(EXPECTED) <= routes, f"EXPECTED names routes the app no longer has: {set(EXPECTED) - routes}"
    endpoints = {r.endpoint for r in app.url_map.iter_rules() if r.endpoint != "static"}
    assert endpoints == set(ROUTES), "server/access.py ROUTES must name every endpoint, and only those"
    for r in app.url_map.iter_rules():
        for m in r.methods - {"HEAD", "OPTIONS"}:
            if r.endpoint != "static":
                assert ROUTES[r.endpoint][0] == EXPECTED[(m, r.rule)], (m, r.rule)
    assert all(HOT_ROUTES[p] == EXPECTED[("POST", p)] for p in HOT_ROUTES)


def request_for(url, gateway, method: str, rule: str, who: str):
    """One request of `rule` on scenario A as token `who`, its state set up first by root (a scenario of its own
    where the request changes or deletes one). Returns the response."""
    tok = TOKENS.get(who)
    own = f"team-a-{who}"  # a scenario the call may change without spoiling the others' calls
    maker = tok if who in ROLES else "root"  # who makes the receipts the call names (other, none: cannot in A)
    receipt(url, "root", own)  # exists, with a record
    if rule in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        body = {"model": "m", "input": "hi"} if rule == "/v1/responses" else \
            {**CHAT, "max_tokens": 5} if rule == "/v1/messages" else CHAT
        return call(url, "POST", rule, tok, A, body)
    if rule == "/reef/report":  # on its own receipt
        rid = receipt(url, maker, A)
        return call(url, "POST", rule, tok, A, {"score": 1, "references": [rid]})
    if rule == "/v1/messages/count_tokens":
        return call(url, "POST", rule, tok, None, {**CHAT, "max_tokens": 5})
    if rule in ("/v1/models", "/reef/status", "/reef/scenarios", "/healthz") and method == "GET":
        return call(url, "GET", rule, tok)
    if rule == "/reef/scenarios":
        return call(url, "POST", rule, tok, body={"name": f"team-a-new-{who}"})
    if rule == "/reef/records/batch":
        return call(url, "POST", rule, tok, body={"records": [{"scenario": own, "kind": "inference"}]})
    if rule == "/reef/train":
        return call(url, "POST", rule, tok, own, {})
    if rule == "/reef/requests/<request_id>":
        req = RequestStore(gateway.data_dir).create(A, {"text": "be brief"})
        return call(url, "GET", f"/reef/requests/{req['id']}", tok)
    if rule in ("/reef/harness", "/reef/harness/install"):
        call(url, "POST", f"/reef/scenarios/{own}/harness", "root", body={"files": {"system_prompt.md": "x"}})
        return call(url, "GET", rule, tok, own, **({"adapter": "files"} if rule.endswith("install") else {}))
    if rule == "/reef/episodes/<episode>":
        receipt(url, maker, A, session="ep-1")
        return call(url, "GET", "/reef/episodes/ep-1", tok, A)
    name_rule = rule.replace("<name>", own)
    path = name_rule.replace("<record_id>", receipt(url, "root", own)).replace("<episode>", "ep-2")
    if "<episode>" in name_rule:
        receipt(url, "root", own, session="ep-2")
        path += "?caller=" + digest("root")[:16]
    body = {"release_id": "base"} if rule.endswith("rollback") else {"candidate": "c9"} if rule.endswith("promote") \
        else {"files": {"system_prompt.md": "y"}} if rule.endswith("harness") else None
    return call(url, method, path, tok, body=body)


@pytest.mark.parametrize("who", ["agent", "reader", "admin", "other", "none"])
def test_every_route_for_every_role(server, who):
    """Allowed: any answer but 401/403 (a route may still find the request wrong); refused: 403 naming the role or
    the scenario; no token: 401 (all but /healthz)."""
    url, outcomes = server.url, {}
    for (method, rule), role in sorted(EXPECTED.items()):
        r = request_for(url, server.gateway, method, rule, who)
        outcomes[(method, rule)] = r.status_code
        if role is None:
            assert r.status_code == 200, (method, rule, r.text)
        elif who == "none":
            assert r.status_code == 401, (method, rule, r.text)
        elif who == "other" and rule == "/reef/requests/<request_id>":  # named by id alone: as if unknown
            assert r.status_code == 404, (method, rule, r.status_code, r.text)
        elif who == "other" and (method, rule) not in SCENARIO_FREE:
            assert r.status_code == 403 and "may not use scenario" in r.json()["error"]["message"], \
                (method, rule, r.status_code, r.text)
        elif who != "other" and ROLES.index(who) < ROLES.index(role):
            assert r.status_code == 403 and f"needs a token with role {role}" in r.json()["error"]["message"], \
                (method, rule, r.status_code, r.text)
        else:
            assert r.status_code not in (401, 403), (method, rule, r.status_code, r.text)
            assert r.status_code < 500, (method, rule, r.text)
    assert outcomes[("POST", "/v1/chat/completions")] == (200 if who in ("agent", "reader", "admin") else
                                                          403 if who == "other" else 401)


def test_what_each_token_sees_of_the_deployment(server):
    url = server.url
    receipt(url, "root", A)
    receipt(url, "root", "team-b-y")
    full = call(url, "GET", "/reef/status", "root").json()
    assert full["data_dir"] and full["engine"]["base_url"] and full["token"]["role"] == "admin"
    for who in ("agent", "reader", "admin", "other"):
        st = call(url, "GET", "/reef/status", TOKENS[who]).json()
        assert "data_dir" not in st and "engine" not in st and "store" not in st and "hub" not in st, st
        assert str(server.gateway.data_dir) not in json.dumps(st) and "127.0.0.1" not in json.dumps(st)
        assert st["scenarios"] == 1 and st["token"]["id"] == digest(TOKENS[who])[:16]
    listed = [s["name"] for s in call(url, "GET", "/reef/scenarios", TOKENS["reader"]).json()["scenarios"]]
    assert listed == [A]
    assert [s["name"] for s in call(url, "GET", "/reef/scenarios", TOKENS["other"]).json()["scenarios"]] == \
        ["team-b-y"]


def test_a_scenario_outside_the_scope_is_refused_alike_whether_it_exists_or_not(server):
    receipt(server.url, "root", "team-c-exists")
    answers = [call(server.url, "GET", f"/reef/scenarios/{name}", TOKENS["reader"]) for name in
               ("team-c-exists", "team-c-missing")]
    assert [a.status_code for a in answers] == [403, 403]
    assert [a.json()["error"]["message"].split("'")[2] for a in answers] == \
        [answers[0].json()["error"]["message"].split("'")[2]] * 2  # the same words after the name
    r = infer(server.url, TOKENS["agent"], "team-c-new")  # creating one by its first call: refused too
    assert r.status_code == 403 and not server.gateway.scenarios.exists("team-c-new")
    assert infer(server.url, TOKENS["agent"], "team-a-new").status_code == 200  # a name it covers: created
    assert server.gateway.scenarios.exists("team-a-new")


def test_records_carry_the_token_id_never_the_token(server):
    rid = receipt(server.url, TOKENS["agent"])
    rep = call(server.url, "POST", "/reef/report", TOKENS["agent"], A, {"score": 1, "references": [rid]}).json()
    for r in (rid, rep["agent_record_id"]):
        rec = call(server.url, "GET", f"/reef/scenarios/{A}/records/{r}", TOKENS["reader"]).json()
        assert rec["caller"] == digest(TOKENS["agent"])[:16]
        assert TOKENS["agent"] not in json.dumps(rec)
    imported = call(server.url, "POST", "/reef/records/batch", TOKENS["admin"],
                    body={"records": [{"scenario": A, "kind": "inference", "id": f"{A}:imp-1"}]})
    assert imported.status_code == 201
    assert server.gateway.store.get(f"{A}:imp-1")["caller"] == digest(TOKENS["admin"])[:16]


def test_a_chosen_id_tells_nothing_of_another_tenants_records(server):
    """Issue 50 item 8: importing under an id another tenant used answered 409 (an existence test of an id one
    knows). A scoped token's chosen ids start with its scenario's name, so the answer is the same whether the id
    exists elsewhere or not, and two tenants' ids never meet."""
    for rid in ("secret-1", f"{A}:secret-2"):  # ids of another scenario, one of them shaped like team-a's
        call(server.url, "POST", "/reef/records/batch", "root",
             body={"records": [{"scenario": "team-c-x", "kind": "inference", "id": rid}]})
    rid = receipt(server.url, TOKENS["agent"])
    answers = {}
    for chosen in ("secret-1", "never-used"):
        imp = call(server.url, "POST", "/reef/records/batch", TOKENS["admin"],
                   body={"records": [{"scenario": A, "kind": "inference", "id": chosen}]})
        rep = call(server.url, "POST", "/reef/report", TOKENS["agent"], A,
                   {"score": 1, "references": [rid], "agent_record_id": chosen})
        answers[chosen] = (imp.status_code, imp.json()["error"]["message"].replace(chosen, "ID"),
                           rep.status_code, rep.json()["error"]["message"].replace(chosen, "ID"))
    assert answers["secret-1"] == answers["never-used"] and answers["secret-1"][0::2] == (400, 400), answers
    # a record names releases of its own scenario only (ctxd reads the release a sample names: issue 50 item 4)
    for release in ("team-c-x:v1", "team-c-x:v9"):
        imp = call(server.url, "POST", "/reef/records/batch", TOKENS["admin"],
                   body={"records": [{"scenario": A, "kind": "inference", "release_id": release}]})
        assert imp.status_code == 400 and "names a release of another scenario" in imp.text, imp.text
    ok = call(server.url, "POST", "/reef/records/batch", TOKENS["admin"],
              body={"records": [{"scenario": A, "kind": "inference", "release_id": f"{A}:v1"}]})
    assert ok.status_code == 201, ok.text
    assert f"start with the scenario's name and ':' (e.g. '{A}:my-id')" in answers["secret-1"][1]
    # under the scenario's own name: its own ids, created, repeated idempotently
    for _ in range(2):
        rep = call(server.url, "POST", "/reef/report", TOKENS["agent"], A,
                   {"score": 1, "references": [rid], "agent_record_id": f"{A}:r1"})
        assert rep.status_code == 200, rep.text
    assert rep.json()["created"] is False
    # the root token chooses freely (as in Reef, and with auth off)
    root = call(server.url, "POST", "/reef/report", "root", A, {"score": 1, "references": [rid], "id": "free-1"})
    assert root.status_code == 200, root.text


def test_a_scoped_admin_sees_no_server_paths(server):
    """Issue 50 item 8: publish and release answers carried `folder: <data dir>/...`, which only an admin of every
    scenario may see."""
    data = str(server.gateway.data_dir)
    pub = call(server.url, "POST", f"/reef/scenarios/{A}/harness", TOKENS["admin"],
               body={"files": {"system_prompt.md": "v1"}})
    call(server.url, "POST", f"/reef/scenarios/{A}/harness", TOKENS["admin"],
         body={"files": {"system_prompt.md": "v2"}})
    back = call(server.url, "POST", f"/reef/scenarios/{A}/rollback", TOKENS["admin"], body={"release_id": "v1"})
    seen = [pub, back, call(server.url, "GET", f"/reef/scenarios/{A}/releases", TOKENS["reader"]),
            call(server.url, "GET", "/reef/status", TOKENS["admin"])]
    for r in seen:
        assert r.status_code in (200, 201), r.text
        assert data not in r.text and '"folder"' not in r.text, r.text[:400]
    assert pub.json()["release_id"] == f"{A}:v1" and back.json()["serving"] == f"{A}:v1"
    whole = call(server.url, "GET", f"/reef/scenarios/{A}/releases", "root").json()
    assert all(rel["folder"].startswith(data) for rel in whole["releases"])  # the deployment's admin sees them


def test_a_second_token_cannot_touch_the_first_ones_scenario(server, tmp_path):
    """Issue 38 item 3: a second token read, reported on, imported into, overwrote the harness of, rolled back and
    deleted the first token's scenario and injected turns into its episode. All refused now."""
    url, owner, attacker = server.url, TOKENS["admin"], TOKENS["other"]
    call(url, "POST", f"/reef/scenarios/{A}/harness", owner, body={"files": {"system_prompt.md": "owner's"}})
    call(url, "POST", f"/reef/scenarios/{A}/harness", owner, body={"files": {"system_prompt.md": "owner's v2"}})
    turns = [receipt(url, owner, session="run-1", text=f"t{i}") for i in range(2)]
    tries = {
        "read records": call(url, "GET", f"/reef/scenarios/{A}/records", attacker),
        "read a record": call(url, "GET", f"/reef/scenarios/{A}/records/{turns[0]}", attacker),
        "read the episode": call(url, "GET", "/reef/episodes/run-1", attacker, A),
        "read the harness": call(url, "GET", "/reef/harness", attacker, A),
        "report": call(url, "POST", "/reef/report", attacker, A, {"score": 0, "references": turns}),
        "report on the episode": call(url, "POST", "/reef/report", attacker, A, {"score": 0, "episode": "run-1"}),
        "import": call(url, "POST", "/reef/records/batch", attacker, body={"records": [
            {"scenario": "team-b-mine", "kind": "inference"}, {"scenario": A, "kind": "report", "score": 0,
                                                              "references": [turns[0]]}]}),
        "import by the header": call(url, "POST", "/reef/records/batch", attacker, A,
                                     {"records": [{"kind": "inference"}]}),
        "overwrite the harness": call(url, "POST", f"/reef/scenarios/{A}/harness", attacker,
                                      body={"files": {"system_prompt.md": "pwned"}}),
        "roll back": call(url, "POST", f"/reef/scenarios/{A}/rollback", attacker, body={"release_id": "base"}),
        "train": call(url, "POST", "/reef/train", attacker, body={"scenario": A}),
        "delete": call(url, "DELETE", f"/reef/scenarios/{A}", attacker),
        "inject a turn": infer(url, attacker, A, session="run-1"),
    }
    for what, r in tries.items():
        assert r.status_code == 403, (what, r.status_code, r.text)
    assert "records[1]" in tries["import"].json()["error"]["message"]  # the record outside its scope is named
    assert not server.gateway.scenarios.exists("team-b-mine")  # all or nothing: nothing of the batch was written
    # An agent of the same scenario (another tenant there) reuses the session id: its calls are its own episode.
    intruder = TOKENS["agent"]
    injected = receipt(url, intruder, session="run-1", text="do something else")
    mine = call(url, "GET", "/reef/episodes/run-1", owner, A).json()
    assert [r["id"] for r in mine["records"]] == turns and mine["turns"] == 2
    theirs = call(url, "POST", "/reef/report", intruder, A, {"score": 0, "references": turns[:1]})
    assert theirs.status_code == 403 and "not made with this token" in theirs.json()["error"]["message"]
    rep = call(url, "POST", "/reef/report", intruder, A, {"score": 0, "episode": "run-1"}).json()
    assert server.gateway.store.get(rep["agent_record_id"])["references"] == [injected]
    rep = call(url, "POST", "/reef/report", owner, A, {"score": 1, "episode": "run-1"}).json()
    assert server.gateway.store.get(rep["agent_record_id"])["references"] == turns  # the owner's report: its turns
    # a reader of the scenario may read the other token's episode by its id on records
    other_ep = call(url, "GET", "/reef/episodes/run-1", TOKENS["reader"], A, caller=digest(intruder)[:16]).json()
    assert [r["id"] for r in other_ep["records"]] == [injected]
    # and the scenario is as its owner left it
    assert call(url, "GET", "/reef/harness", owner, A).json()["files"]["system_prompt.md"] == "owner's v2"
    assert server.gateway.scenarios.exists(A)


def test_change_requests_of_another_scope_are_not_found(server):
    receipt(server.url, "root", A)
    req = RequestStore(server.gateway.data_dir).create(A, {"text": "be brief"})
    mine = call(server.url, "GET", f"/reef/requests/{req['id']}", TOKENS["reader"])
    assert mine.status_code == 200 and mine.json()["scenario"] == A
    theirs = call(server.url, "GET", f"/reef/requests/{req['id']}", TOKENS["other"])
    unknown = call(server.url, "GET", "/reef/requests/req_00000000000000000000", TOKENS["other"])
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["message"] == f"change request {req['id']!r} not found"


def test_legacy_tokens_stay_admins_of_everything_and_no_token_means_no_auth(serve, stub_url):
    legacy = serve(UpstreamEngine(stub_url), tokens=["t1", "t2"])
    for t in ("t1", "t2"):
        assert infer(legacy.url, t, "anything").status_code == 200
        assert call(legacy.url, "DELETE", "/reef/scenarios/anything", t).status_code == 200
        assert call(legacy.url, "GET", "/reef/status", t).json()["data_dir"]
    assert infer(legacy.url, "t3", "anything").status_code == 401
    open_server = serve(UpstreamEngine(stub_url), data_dir=legacy.gateway.data_dir.parent / "open")
    assert infer(open_server.url, None, "anything").status_code == 200
    assert call(open_server.url, "GET", "/reef/status").json()["token"] is None


def test_the_start_log_says_legacy_tokens_are_admins_of_every_scenario(tmp_path, stub_url, tenants_file):
    """Issue 50 item 10: REEF_TOKEN=t1,t2 makes each token an admin of every scenario, and the start log did not say
    so. Now it does (how many, what they may do, the tokens file as the scoped alternative), never naming a token."""
    secrets = ["legacy-sekrit-one", "legacy-sekrit-two"]
    srv = start_server("--upstream-url", stub_url, "--log-level", "warning", data_dir=tmp_path / "data",
                       log=tmp_path / "serve.log", env={"REEF_TOKEN": f"{secrets[0]}, {secrets[1]},{secrets[0]}"})
    try:
        assert infer(srv.url, secrets[1], "anything").status_code == 200
    finally:
        srv.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "REEF_TOKEN gives 2 tokens, each an admin of every scenario" in log, log[-2000:]
    assert "--tokens-file" in log and "reef-lab token add" in log, log[-2000:]
    assert "sekrit" not in log and "is not set" not in log, log[-2000:]
    # a tokens file alone, or one that scopes the same token, gives no such warning
    assert legacy_tokens_warning([], Tenants.load([], tenants_file)) is None
    assert legacy_tokens_warning([TOKENS["admin"]], Tenants.load([TOKENS["admin"]], tenants_file)) is None


# ---- the tokens file -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("entry,needle", [
    ({"sha256": "abc", "role": "agent", "scenarios": ["a"]}, "'sha256' must be the 64"),
    ({"token": "plain", "role": "agent", "scenarios": ["a"]}, "unknown key(s) ['token']"),
    ({"sha256": "0" * 64, "role": "owner", "scenarios": ["a"]}, "'role' must be one of agent, reader, admin"),
    ({"sha256": "0" * 64, "role": "agent", "scenarios": []}, "'scenarios' must be a non-empty list"),
    ({"sha256": "0" * 64, "role": "agent", "scenarios": ["a/b"]}, "'scenarios' must be a non-empty list"),
])
def test_a_bad_tokens_file_is_refused_at_start_naming_the_entry(tmp_path, entry, needle):
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [entry]}))
    with pytest.raises(ValueError, match=r"tokens\[0\]") as e:
        read_tokens_file(path)
    assert needle in str(e.value)
    from reef_lab.config import ServeConfig

    with pytest.raises(ValueError, match=r"tokens\[0\]"):
        ServeConfig(tokens_file=str(path), data_dir=str(tmp_path / "d"))


def test_the_cli_adds_a_token_and_prints_it_once(tmp_path):
    path = tmp_path / "tokens.yaml"
    out = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "add", "--file", str(path),
                          "--role", "reader", "--scenario", "team-a-*", "--scenario", "solo", "--name", "alice"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert token.startswith("reef-") and token not in path.read_text() and digest(token) in path.read_text()
    grant = Tenants(read_tokens_file(path)).identify(f"Bearer {token}", "")
    assert grant == Grant(digest(token)[:16], "reader", ("team-a-*", "solo"))
    second, _ = add_token(path, "agent", ["b"])
    assert len(read_tokens_file(path)) == 2 and second != token
    hashed = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "hash"], input=token + "\n",
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert hashed.stdout.strip() == digest(token)
    bad = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "add", "--file", str(path),
                          "--role", "agent", "--scenario", "a/b"], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert bad.returncode == 1 and "'scenarios' must be" in bad.stderr and len(read_tokens_file(path)) == 2
    revoked = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "revoke",
                              digest(token)[:16], "--file", str(path)], capture_output=True, text=True, cwd=ROOT,
                             timeout=120)
    assert revoked.returncode == 0, revoked.stderr
    assert len(read_tokens_file(path)) == 1 and digest(token) not in path.read_text()
    again = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "revoke",
                            digest(token)[:16], "--file", str(path)], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
    assert again.returncode == 1 and "no token with id" in again.stderr


# ---- several workers ---------------------------------------------------------------------------------------------
def raw_call(port, method, path, token, scenario, body=None):
    """On a fresh connection, so that successive calls land on either worker."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, None if body is None else json.dumps(body),
              {"Content-Type": "application/json", "x-reef-scenario": scenario, "Authorization": f"Bearer {token}"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def test_every_worker_checks_the_token(tmp_path, stub_url, tenants_file):
    """With a primary and a relay, inference of an existing scenario is served by either; both refuse a token of
    another scope, both record the caller, and a report (taken by either) on another token's receipt is refused."""
    data_dir = tmp_path / "data"
    srv = start_server("--upstream-url", stub_url, "--workers", "2", "--log-level", "warning", "--tokens-file",
                       str(tenants_file), data_dir=data_dir, log=tmp_path / "serve.log", env={"REEF_TOKEN": ""})
    try:
        port = srv.port
        status, _, data = raw_call(port, "POST", "/v1/chat/completions", TOKENS["admin"], A, CHAT)
        assert status == 200, data  # A exists: from here on either worker serves it
        receipts, logs = [], set()
        while len(receipts) < 20 or len(logs) < 2:
            assert len(receipts) < 400, "one worker answered every call"
            status, headers, data = raw_call(port, "POST", "/v1/chat/completions", TOKENS["agent"], A, CHAT)
            assert status == 200, data
            receipts.append(headers["x-reef-agent-record-id"])
            logs = {p for p in (data_dir / "records").glob("log-*.bin") if read_log(p)[0]}
            status, _, data = raw_call(port, "POST", "/v1/chat/completions", TOKENS["other"], A, CHAT)
            assert status == 403 and b"may not use scenario" in data
            status, _, data = raw_call(port, "POST", "/reef/report", TOKENS["reader"], A,
                                       {"score": 1, "references": receipts[-1:]})
            assert status == 403 and b"not made with this token" in data
            status, _, data = raw_call(port, "POST", "/reef/report", TOKENS["other"], A,
                                       {"score": 1, "references": receipts[-1:]})
            assert status == 403
        for rid in receipts[::5]:
            status, _, data = raw_call(port, "GET", f"/reef/scenarios/{A}/records/{rid}", TOKENS["reader"], A)
            assert status == 200 and json.loads(data)["caller"] == digest(TOKENS["agent"])[:16]
        status, _, data = raw_call(port, "POST", "/reef/report", TOKENS["agent"], A,
                                   {"score": 1, "references": receipts})
        assert status == 200, data
        status, _, _ = raw_call(port, "GET", "/reef/status", "wrong", A)
        assert status == 401
    finally:
        srv.stop()
