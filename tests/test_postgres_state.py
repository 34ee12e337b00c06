"""A shared deployment's state in a real PostgreSQL (issue 52): gateways with their own data dirs on one database.

The server is Debian's, started in a temporary folder on loopback (reef_lab/testing/postgres.py); the clients are
the real OpenAI SDK and plain HTTP. Skipped only on a machine without PostgreSQL's server or psycopg.
"""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest
from openai import OpenAI

from reef_lab.errors import Conflict, StoreUnavailable
from reef_lab.records.record import Record
from reef_lab.testing import postgres as pgtest

pytestmark = pytest.mark.skipif(pgtest.bindir() is None, reason="PostgreSQL's server is not installed")
psycopg = pytest.importorskip("psycopg")

from reef_lab.gateway.gateway import Gateway  # noqa: E402
from reef_lab.records.postgres import PgRecordStore  # noqa: E402
from reef_lab.state.postgres import PgState, SchemaTooNew  # noqa: E402
from tests.conftest import Running  # noqa: E402


@pytest.fixture(scope="module")
def pg():
    with pgtest.Postgres() as server:
        yield server


@pytest.fixture
def db(pg, request):
    """A fresh database of its own for each test (state never leaks from one test to the next)."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "").replace("-", "_")[:50]
    with psycopg.connect(pg.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    return pg.url.rsplit("/", 1)[0] + "/" + name


def _gateway(url: str, data_dir, engine) -> Running:
    return Running(Gateway(data_dir, engine, state=PgState(url)))


def _chat(base: str, scenario: str, text: str = "hi"):
    client = OpenAI(base_url=f"{base}/v1", api_key="x", default_headers={"x-reef-scenario": scenario},
                    max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": text}], max_tokens=4)
    return raw.headers["x-reef-agent-record-id"]


def test_two_gateways_share_receipts_reports_and_scenarios(db, tmp_path, stub_url):
    from reef_lab.engines.upstream import UpstreamEngine

    a = _gateway(db, tmp_path / "a", UpstreamEngine(stub_url, timeout=5.0))
    b = _gateway(db, tmp_path / "b", UpstreamEngine(stub_url, timeout=5.0))
    try:
        receipts = [_chat(a.url, "shared", f"q{i}") for i in range(5)]
        # the scenario the first call created at A is B's too, and B reads A's receipts
        deadline = time.monotonic() + 5
        while not b.gateway.scenarios.exists("shared") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.gateway.scenarios.exists("shared")
        got = httpx.get(f"{b.url}/reef/scenarios/shared/records/{receipts[0]}").json()
        assert got["id"] == receipts[0] and got["scenario"] == "shared"
        # a report at B on A's receipt
        r = httpx.post(f"{b.url}/reef/report", headers={"x-reef-scenario": "shared"},
                       json={"references": receipts[:2], "score": 1.0})
        assert r.status_code in (200, 201), r.text
        listed = httpx.get(f"{a.url}/reef/scenarios/shared/records", params={"kind": "report"}).json()
        assert len(listed["records"]) == 1 and listed["records"][0]["references"] == receipts[:2]
        # A's machine is lost: process gone, data dir deleted; B still reads every receipt A gave
        a.stop()
        shutil.rmtree(tmp_path / "a")
        for rid in receipts:
            assert httpx.get(f"{b.url}/reef/scenarios/shared/records/{rid}").status_code == 200
        # a scenario deleted at B is gone at a gateway started afterwards on an empty data dir
        assert httpx.delete(f"{b.url}/reef/scenarios/shared").status_code == 200
        c = _gateway(db, tmp_path / "c", UpstreamEngine(stub_url, timeout=5.0))
        try:
            assert not c.gateway.scenarios.exists("shared")
            assert httpx.get(f"{c.url}/reef/scenarios/shared/records/{receipts[0]}").status_code == 404
        finally:
            c.stop()
    finally:
        b.stop()


def test_a_scenario_made_at_one_gateway_holds_at_the_other_within_5_s(db, tmp_path, stub_url):
    from reef_lab.engines.upstream import UpstreamEngine

    a = _gateway(db, tmp_path / "a", UpstreamEngine(stub_url, timeout=5.0))
    b = _gateway(db, tmp_path / "b", UpstreamEngine(stub_url, timeout=5.0))
    try:
        r = httpx.post(f"{a.url}/reef/scenarios", json={"name": "made-at-a", "recipe": "basic"})
        assert r.status_code == 201, r.text
        t0 = time.monotonic()
        while not b.gateway.scenarios.exists("made-at-a"):
            assert time.monotonic() - t0 < 5, "the scenario did not reach the other gateway in 5 s"
            time.sleep(0.02)
        # the same name made at B now is the conflict the database's key decides
        assert httpx.post(f"{b.url}/reef/scenarios", json={"name": "made-at-a"}).status_code == 409
        # a harness published by hand at A serves at B within 5 s (the stub answers `!system` with the system text)
        files = {"system_prompt.md": "You are terse.", "rules.md": "- Answer with a number."}
        r = httpx.post(f"{a.url}/reef/scenarios/made-at-a/harness", json={"files": files})
        assert r.status_code == 201 and r.json()["release_id"] == "made-at-a:v1", r.text

        def served_at_b() -> str:
            r = httpx.post(f"{b.url}/v1/chat/completions", headers={"x-reef-scenario": "made-at-a"},
                           json={"model": "m", "messages": [{"role": "user", "content": "!system"}]})
            return r.headers.get("x-reef-release-id", "")
        t0 = time.monotonic()
        while served_at_b() != "made-at-a:v1":
            assert time.monotonic() - t0 < 5, "the harness did not reach the other gateway in 5 s"
            time.sleep(0.05)
        assert httpx.get(f"{b.url}/reef/harness", headers={"x-reef-scenario": "made-at-a"}).json()["files"] == files
        httpx.delete(f"{a.url}/reef/scenarios/made-at-a").raise_for_status()
        t0 = time.monotonic()
        while b.gateway.scenarios.exists("made-at-a"):
            assert time.monotonic() - t0 < 5, "the deletion did not reach the other gateway in 5 s"
            time.sleep(0.02)
    finally:
        a.stop()
        b.stop()


def test_group_commit_under_concurrency_and_chosen_id_conflicts(db):
    state = PgState(db)
    store = PgRecordStore(state)
    try:
        ids: list[str] = []
        lock = threading.Lock()

        def write(k: int) -> None:
            for i in range(25):
                rec = Record(f"s:w{k}-{i}", "s", "inference", request={"i": i})
                assert store.append([rec]) == [True]
                with lock:
                    ids.append(rec.id)
        threads = [threading.Thread(target=write, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(store) == 400 and sorted(ids) == store.ids("s")
        assert store.stats["commits"] < 400  # appenders shared commits
        # client-chosen ids: same content is idempotent, other content conflicts and writes nothing of its append
        one = Record("s:chosen", "s", "inference", request={"a": 1}, content_hash="h1")
        assert store.append([one]) == [True]
        assert store.append([Record("s:chosen", "s", "inference", request={"a": 1}, content_hash="h1")]) == [False]
        with pytest.raises(Conflict):
            store.append([Record("s:fresh", "s", "inference", content_hash="h3"),
                          Record("s:chosen", "s", "inference", request={"a": 2}, content_hash="h2")])
        assert store.get("s:fresh") is None and store.get("s:chosen")["request"] == {"a": 1}
    finally:
        state.close()


def test_a_newer_schema_is_refused_with_the_fix(db):
    PgState(db).close()
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE reef_schema SET version = version + 1")
    with pytest.raises(SchemaTooNew, match="upgrade reef_lab"):
        PgState(db)


def test_postgres_down_is_503_with_retry_after_and_recovers_by_itself():
    server = pgtest.Postgres().start()  # a folder of its own: postgres may not enter pytest's (0700)
    state = PgState(server.url)
    store = PgRecordStore(state)
    try:
        assert store.append([Record("s:before", "s", "inference")]) == [True]
        server.kill()
        with pytest.raises(StoreUnavailable) as err:
            store.append([Record("s:during", "s", "inference")])
        assert err.value.status == 503 and err.value.headers.get("retry-after")
        assert "unavailable" in (state.problem or "")
        server.start()
        deadline = time.monotonic() + 20
        while True:  # the pool replaces its broken connections by itself: no restart of reef_lab
            try:
                assert store.append([Record("s:after", "s", "inference")]) == [True]
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, state.problem
                time.sleep(0.2)
        assert store.get("s:before") is not None and store.get("s:during") is None
        assert state.problem is None
    finally:
        state.close()
        server.close()


# ---- gateways and a learner service (weights trained on the tiny Llama) ----------------------------------------
TRAINER = {"lr": 1e-3, "micro_batch_size": 4}


def _service(db: str, data_dir, model_dir, service: str, artifacts) -> Gateway:
    from reef_lab.engines.embedded import EmbeddedEngine

    return Gateway(data_dir, EmbeddedEngine.from_path(str(model_dir), max_batch=8), state=PgState(db, service=service),
                   service=service, artifacts=artifacts)


def _ask(gw: Gateway, scenario: str, item: dict, seed: int = 0) -> tuple[str, str]:
    import orjson

    reply = gw.infer("openai.chat", {"model": "tiny", "messages": item["messages"], "max_tokens": 6,
                                     "temperature": 1.0, "seed": seed}, scenario)
    orjson.loads(reply.body)
    return reply.headers["x-reef-agent-record-id"], reply.headers["x-reef-release-id"]


def _wait(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("store", ["folder", "object-store"])
def test_two_gateways_and_a_learner_service_release_to_both(db, tmp_path, tiny_model_dir, store):
    """`folder`: one artifacts folder every service mounts; `object-store`: an fsspec URL (file:// here, the same
    code as s3://), each service with its own copy of the releases it serves."""
    from reef_lab.tasks.base import make_task

    artifacts = tmp_path / "artifacts" if store == "folder" else f"file://{tmp_path}/bucket/releases"
    a = _service(db, tmp_path / "a", tiny_model_dir, "gateway", artifacts)
    b = _service(db, tmp_path / "b", tiny_model_dir, "gateway", artifacts)
    learner = _service(db, tmp_path / "l", tiny_model_dir, "learner", artifacts)
    try:
        a.create_scenario({"name": "s", "recipe": "sft", "config": {"batch_size": 4, "trainer": TRAINER}})
        _wait(lambda: b.scenarios.exists("s") and learner.scenarios.exists("s"), 5, "scenario not shared")
        items = make_task().items(8, seed=5)
        for k, item in enumerate(items):  # calls at A, reports at B: 4 good samples, one batch
            receipt, release = _ask(a, "s", item, seed=k)
            assert release == "base"
            b.report("s", {"score": float(k % 2), "references": [receipt]})
        assert a.learners.running("s") is None and b.learners.running("s") is None  # gateways only serve
        _wait(lambda: learner.learners.running("s") is not None, 10, "the learner service did not take the work")
        ln = learner.learners.running("s")
        _wait(lambda: learner.list_releases("s")["serving"] == "s:v1", 300, f"no release: {ln.status()}")
        assert ln.last_error is None and ln.status()["consumed"] == 4, ln.status()  # the 4 good samples
        probe = make_task().items(1, seed=99)[0]
        for gw in (a, b):  # served by both gateways within 5 s of the release, no restart
            _wait(lambda gw=gw: _ask(gw, "s", probe)[1] == "s:v1", 5, "release not served by a gateway")
        folder = learner.list_releases("s")["releases"][0]["folder"]
        if store == "folder":
            assert folder.startswith(str(artifacts))
        else:  # in the bucket, and fetched by each gateway into its own data dir when it served it
            assert (tmp_path / "bucket" / "releases" / "s" / "v1" / "model.safetensors").exists()
            for name in ("a", "b"):
                assert (tmp_path / name / "releases" / "s" / "v1" / "model.safetensors").exists()
        assert learner.status()["learning_here"] == ["s"] and a.status()["learning_here"] == []
        # deleted at a gateway: the learner service stops its learner and gives the lease back
        a.delete_scenario("s")
        _wait(lambda: learner.learners.running("s") is None and not learner.state.lease_holders("learner:"), 5,
              "the learner service kept learning a deleted scenario")
    finally:
        for gw in (a, b, learner):
            gw.close()


def test_a_token_added_or_revoked_in_the_shared_state_holds_at_every_gateway_within_5_s(db, tmp_path, stub_url):
    import subprocess
    import sys

    from reef_lab.engines.upstream import UpstreamEngine
    from reef_lab.tenants import Tenants, follow_shared

    admin = "admin-secret"
    gateways = []
    for name in ("a", "b"):
        gw = Gateway(tmp_path / name, UpstreamEngine(stub_url, timeout=5.0), state=PgState(db))
        tenants = Tenants.load([admin])
        follow_shared(tenants, gw.state)
        gateways.append(Running(gw, tenants))
    try:
        def status(url: str, token: str) -> int:
            return httpx.get(f"{url}/reef/status", headers={"Authorization": f"Bearer {token}"}).status_code

        # `reef-lab token add --state`, as the operator runs it: printed once, taken by both gateways
        out = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "add", "--state", db,
                              "--role", "reader", "--scenario", "*", "--name", "ops"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        token = out.stdout.strip()
        for r in gateways:
            _wait(lambda r=r: status(r.url, token) == 200, 5, "a new token not taken within 5 s")
        token_id = next(g.id for g in Tenants.load([token]).grants.values())
        out = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "revoke", token_id,
                              "--state", db], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        for r in gateways:
            _wait(lambda r=r: status(r.url, token) == 401, 5, "a revoked token still taken after 5 s")
            assert status(r.url, admin) == 200  # REEF_TOKEN's own tokens are never taken away by the state
        bad = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "revoke", token_id,
                              "--state", db], capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "no token with id" in bad.stderr
    finally:
        for r in gateways:
            r.stop()


def test_an_episode_through_two_gateways_is_one_and_exports_from_the_database(db, tmp_path, stub_url):
    import subprocess
    import sys

    import polars as pl

    from reef_lab.engines.upstream import UpstreamEngine

    a = _gateway(db, tmp_path / "a", UpstreamEngine(stub_url, timeout=5.0))
    b = _gateway(db, tmp_path / "b", UpstreamEngine(stub_url, timeout=5.0))
    try:
        turns = []
        for i, gw in enumerate((a, b, a)):  # an agent's turns land on whichever gateway the balancer picks
            r = httpx.post(f"{gw.url}/v1/chat/completions", headers={"x-reef-scenario": "ep", "x-reef-session":
                                                                      "sess-1"},
                           json={"model": "m", "messages": [{"role": "user", "content": f"turn {i}"}]})
            assert r.status_code == 200, r.text
            turns.append(r.headers["x-reef-agent-record-id"])
        for gw in (a, b):
            ep = httpx.get(f"{gw.url}/reef/scenarios/ep/episodes/sess-1").json()
            assert [t["id"] for t in ep["records"]] == turns
        r = httpx.post(f"{b.url}/reef/report", headers={"x-reef-scenario": "ep"},
                       json={"episode": "sess-1", "score": 1.0})
        assert r.status_code == 200, r.text
        out = subprocess.run([sys.executable, "scripts/export_records.py", "--state", db, "--scenario", "ep",
                              "--out", str(tmp_path / "export")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        inferences = pl.read_parquet(tmp_path / "export" / "inferences.parquet")
        reports = pl.read_parquet(tmp_path / "export" / "reports.parquet")
        assert sorted(inferences["id"].to_list()) == sorted(turns) and reports["references"].to_list() == [turns]
    finally:
        a.stop()
        b.stop()


def test_a_learner_that_lost_its_lease_cannot_release(db, tmp_path):
    """Two learners never release for one scenario: one that paused past its lease (here: its lease run out in the
    database) finds its next write refused, while the one that took over writes."""
    from reef_lab.publishing.releases import ReleaseStore
    from reef_lab.state.postgres import LeaseKeeper

    one, two = PgState(db, service="learner"), PgState(db, service="learner")
    k1, k2 = LeaseKeeper(one, ttl=30), LeaseKeeper(two, ttl=30)
    r1 = ReleaseStore(tmp_path / "1", one, tmp_path / "art", fence=lambda s: k1.fence("learner:" + s))
    r2 = ReleaseStore(tmp_path / "2", two, tmp_path / "art", fence=lambda s: k2.fence("learner:" + s))
    try:
        assert k1.claim("learner:s") and not k2.claim("learner:s")
        assert r1.new_candidate("s", {"recipe": "sft"})[0] == "c1"
        with psycopg.connect(db, autocommit=True) as c:  # the pause: its lease runs out
            c.execute("UPDATE leases SET expires_at = now() - interval '1 s'")
        assert k2.claim("learner:s")
        with pytest.raises(Conflict, match="no longer holds the lease"):
            r1.update_candidate("s", "c1", status="evaluated")
        assert r2.new_candidate("s", {"recipe": "sft"})[0] == "c2"
        assert [c["id"] for c in r1.index("s")["candidates"]] == ["c1", "c2"]  # one index, the holder's writes
        assert r1.index("s")["candidates"][0]["status"] == "training"
    finally:
        for x in (k1, k2, one, two):
            x.close()


def test_a_change_request_at_a_gateway_is_taken_up_by_the_learner_service(db, tmp_path):
    """A harness scenario learned by a learner service: the request posted at a gateway is stored in the
    database, the learner service hears of it, proposes, releases, and the gateway serves the new harness."""
    from reef_lab.engines.upstream import UpstreamEngine
    from reef_lab.testing.scripted_provider import ScriptedProvider

    seed = {"system_prompt.md": "You are careful.", "rules.md": "- RULE-ONE\n"}
    with ScriptedProvider() as provider:
        config = {"mode": "manual", "seed_harness": seed, "val_size": 2, "requests": {
            "proposer_lm": {"kind": "openai", "base_url": provider.url, "model": "scripted"}}}

        def service(name: str, kind: str) -> Gateway:
            return Gateway(tmp_path / name, UpstreamEngine(provider.url, model="scripted-model"),
                           default_recipe="gepa", default_config=config, state=PgState(db, service=kind),
                           service=kind, artifacts=tmp_path / "artifacts")
        gw = Running(service("g", "gateway"))
        learner = service("l", "learner")
        try:
            assert httpx.post(f"{gw.url}/reef/scenarios", json={"name": "s"}).status_code == 201
            _wait(lambda: gw.gateway.serving_table.get("s") is not None, 20,
                  "the learner service did not publish the seed harness")
            r = httpx.post(f"{gw.url}/reef/train", headers={"x-reef-scenario": "s"},
                           json={"text": "Always add a CHANGELOG entry"})
            assert r.status_code == 202, r.text
            rid = r.json()["request_id"]
            _wait(lambda: httpx.get(f"{gw.url}/reef/requests/{rid}").json()["state"] == "released", 60,
                  f"not released: {httpx.get(f'{gw.url}/reef/requests/{rid}').json()}")
            _wait(lambda: "CHANGELOG" in httpx.get(f"{gw.url}/reef/harness", headers={"x-reef-scenario": "s"}
                                                   ).json()["files"]["rules.md"], 5, "the gateway did not serve it")
            listed = httpx.get(f"{gw.url}/reef/scenarios/s/requests").json()["requests"]
            assert [q["id"] for q in listed] == [rid]
        finally:
            gw.stop()
            learner.close()
