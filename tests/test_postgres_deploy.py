"""A shared deployment as its operator runs it (issue 52's check): real `scripts/serve.py` processes, each with its own
data dir, on one real PostgreSQL and one artifacts folder; killed with -9 the way machines are lost.

Two gateways (`--service gateway`) and a learner (`--service learner`) serve and train the tiny Llama: calls at one
gateway, reports at the other, the learner's release served by both; kill -9 of the learner mid-work and a standby
learner finishes the round, no report lost or trained twice; kill -9 of a gateway and its data dir deleted, every
receipt it gave reads back at the other; PostgreSQL itself killed -9 and restarted under load, every acknowledged
record still there and the 503s carrying Retry-After.
"""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import pytest

from reef_lab.testing import postgres as pgtest
from reef_lab.testing.processes import start_server

pytestmark = [pytest.mark.heavy, pytest.mark.deploy,
              pytest.mark.skipif(pgtest.bindir() is None, reason="PostgreSQL's server is not installed")]
pytest.importorskip("psycopg")

RECIPE = "{batch_size: 4, trainer: {lr: 0.001, micro_batch_size: 4}}"
ITEMS = [f"What is {a} + {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 9), (4, 4), (6, 1), (8, 3)]]


def serve(service: str, folder, db: str, artifacts, log) -> object:
    return start_server("--model-path", "tiny", "--service", service, "--state", db, "--artifacts", str(artifacts),
                        "--recipe", "sft", "--recipe-config", RECIPE, "--log-level", "warning",
                        data_dir=folder, log=log, timeout=180)


def call(url: str, text: str, scenario: str = "s") -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"x-reef-scenario": scenario}, timeout=60,
                      json={"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4})


def report(url: str, receipt: str, score: float) -> None:
    r = httpx.post(f"{url}/reef/report", headers={"x-reef-scenario": "s"}, timeout=30,
                   json={"references": [receipt], "score": score})
    assert r.status_code == 200, r.text


def releases(url: str) -> dict:
    return httpx.get(f"{url}/reef/scenarios/s/releases", timeout=30).json()


def wait(cond, seconds: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < seconds, what
        time.sleep(0.1)
    return time.monotonic() - t0


def serving_release(url: str) -> str:
    return call(url, "What is 1 + 1?").headers["x-reef-release-id"]


def test_gateways_and_learners_on_shared_state_survive_kill_9(tmp_path):
    pg = pgtest.Postgres().start()
    artifacts = tmp_path / "artifacts"
    children = []
    try:
        g1 = serve("gateway", tmp_path / "g1", pg.url, artifacts, tmp_path / "g1.log")
        g2 = serve("gateway", tmp_path / "g2", pg.url, artifacts, tmp_path / "g2.log")
        l1 = serve("learner", tmp_path / "l1", pg.url, artifacts, tmp_path / "l1.log")
        children += [g1, g2, l1]
        assert httpx.get(f"{l1.url}/v1/models").status_code == 404  # a learner service serves no traffic

        # calls at one gateway, reports at the other; the learner trains and both gateways serve its release
        receipts = []
        for k, text in enumerate(ITEMS):
            r = call(g1.url, text)
            assert r.status_code == 200, r.text
            receipts.append(r.headers["x-reef-agent-record-id"])
            report(g2.url, receipts[-1], float(k % 2))
        wait(lambda: releases(g2.url)["serving"] == "s:v1", 300, f"no release v1: {l1.log_tail()}")
        for g in (g1, g2):
            wait(lambda g=g: serving_release(g.url) == "s:v1", 5, "a gateway did not serve v1 within 5 s")
        v1 = releases(g1.url)["releases"][0]
        assert set(v1["records"]) == {receipts[k] for k in range(1, 8, 2)}

        # kill -9 of the learner with reports it has not trained: a standby learner takes them over
        l2 = serve("learner", tmp_path / "l2", pg.url, artifacts, tmp_path / "l2.log")
        children.append(l2)
        second = []
        for k, text in enumerate(ITEMS):
            r = call(g2.url, text + " ")
            second.append(r.headers["x-reef-agent-record-id"])
            report(g1.url, second[-1], float(k % 2))
        l1.proc.kill()
        killed = time.monotonic()
        l1.proc.wait(timeout=30)
        wait(lambda: "s" in httpx.get(f"{l2.url}/reef/status", timeout=10).json().get("learning_here", []), 30,
             f"the standby learner did not take the scenario over in 30 s: {l2.log_tail()}")
        took = time.monotonic() - killed
        wait(lambda: releases(g1.url)["serving"] == "s:v2", 300, f"no release v2: {l2.log_tail()}")
        rels = releases(g2.url)["releases"]
        assert len(rels) == 2 and rels[1]["parent"] == "s:v1", rels  # one release for the round, not two
        assert set(rels[1]["records"]) == {second[k] for k in range(1, 8, 2)}  # every report, none twice
        for g in (g1, g2):
            wait(lambda g=g: serving_release(g.url) == "s:v2", 5, "a gateway did not serve v2 within 5 s")
        print(f"learner takeover after kill -9: {took:.1f} s")

        # kill -9 of a gateway and its data dir gone: every receipt it gave reads back at the other
        g1.proc.kill()
        g1.proc.wait(timeout=30)
        shutil.rmtree(tmp_path / "g1")
        for rid in receipts:
            assert httpx.get(f"{g2.url}/reef/scenarios/s/records/{rid}", timeout=10).status_code == 200, rid

        # PostgreSQL killed -9 and restarted under load: 0 acknowledged records lost, 503 + Retry-After meanwhile
        acked, refused, other, stop = [], [], [], threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    r = call(g2.url, "load")
                except httpx.HTTPError as e:
                    other.append(repr(e))
                    continue
                if r.status_code == 200:
                    acked.append(r.headers["x-reef-agent-record-id"])
                elif r.status_code == 503:
                    refused.append(r.headers.get("retry-after"))
                else:
                    other.append(f"{r.status_code} {r.text[:200]}")
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(2)
        pg.kill()
        time.sleep(2)
        down = httpx.get(f"{g2.url}/healthz", timeout=10)
        assert down.status_code == 503 and "unavailable" in down.json()["error"]
        pg.start()
        wait(lambda: httpx.get(f"{g2.url}/healthz", timeout=10).status_code == 200, 30, "no recovery")
        n = len(acked)
        wait(lambda: len(acked) > n + 5, 30, "calls did not succeed again after PostgreSQL returned")
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert refused and all(r for r in refused), "no 503 with Retry-After while PostgreSQL was down"
        assert not other, other[:5]
        missing = [rid for rid in acked
                   if httpx.get(f"{g2.url}/reef/scenarios/s/records/{rid}", timeout=10).status_code != 200]
        assert missing == [], f"{len(missing)} of {len(acked)} acknowledged records lost"
        print(f"under load: {len(acked)} acknowledged, {len(refused)} refused with 503 while PostgreSQL was down")
    finally:
        for c in children:
            c.proc.kill()
        pg.close()


def test_relay_workers_write_to_the_database_and_follow_its_tokens(tmp_path, stub_url):
    """With a provider, serve.py runs a primary and relay workers on one port: on shared state the relays write
    their records to the database themselves and take the database's tokens too."""
    import subprocess
    import sys

    pg = pgtest.Postgres().start()
    try:
        srv = start_server("--upstream-url", stub_url, "--workers", "2", "--state", pg.url, "--log-level", "warning",
                           data_dir=tmp_path / "d", log=tmp_path / "d.log", env={"REEF_TOKEN": "admin-secret"})
        try:
            admin = {"Authorization": "Bearer admin-secret", "x-reef-scenario": "r"}
            receipts = []
            for i in range(40):  # a fresh connection each: both workers answer some
                r = httpx.post(f"{srv.url}/v1/chat/completions", headers=admin, timeout=30,
                               json={"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]})
                assert r.status_code == 200, r.text
                receipts.append(r.headers["x-reef-agent-record-id"])
            for rid in receipts:
                assert httpx.get(f"{srv.url}/reef/scenarios/r/records/{rid}", headers=admin).status_code == 200
            import psycopg
            with psycopg.connect(pg.url) as c:  # the relay's own group-commit connection wrote some of them
                names = [r[0] for r in c.execute("SELECT application_name FROM pg_stat_activity")]
            assert "reef_lab relay writer" in names and "reef_lab all writer" in names, names
            out = subprocess.run([sys.executable, "-m", "reef_lab.harness.install.cli", "token", "add", "--state",
                                  pg.url, "--role", "agent", "--scenario", "r"], capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, out.stderr
            agent = {"Authorization": f"Bearer {out.stdout.strip()}", "x-reef-scenario": "r"}

            def all_take_it() -> bool:
                return all(httpx.post(f"{srv.url}/v1/chat/completions", headers=agent, timeout=30, json={
                    "model": "m", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
                    for _ in range(8))
            wait(all_take_it, 5, "a worker did not take the database's new token within 5 s")
        finally:
            srv.proc.kill()
    finally:
        pg.close()
