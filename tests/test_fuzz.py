"""Fuzzing the real server: `scripts/serve.py --workers 2` (a primary and a relay) in front of the stub provider.

Seeded requests from reef_lab/testing/fuzz.py, well-formed and hostile, over every route: none may get a 5xx, none
may hold its connection, none may be dropped without an answer, refusals the API promises (a recipe naming code,
an over-size body, a body that is not JSON) must be what it says, and afterwards a well-formed inference and a
report on it succeed. A small count runs by default; 10,000 requests with `-m slow -k 10k`. A request that stops
sending its declared body must get a 408 within the server's body read timeout.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from reef_lab.records.store import read_log
from reef_lab.testing.fuzz import FuzzReport, generate, run, stalled_body
from reef_lab.testing.processes import start_server

ROOT = Path(__file__).resolve().parents[1]

# The server under test reads bodies with this timeout (--read-timeout; the default is ServeConfig's 30 s, shortened
# here so the stalled-body test takes seconds). The 408 must come within it plus SLACK.
BODY_TIMEOUT_S = 5.0
SLACK_S = 3.0


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, data_dir: Path, log: Path):
        self.port, self.proc, self.data_dir, self.log = port, proc, data_dir, log
        self.url = f"http://127.0.0.1:{port}"

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def start(data_dir: Path, stub_url: str, log: Path) -> Server:
    try:
        child = start_server("--upstream-url", stub_url, "--workers", "2", "--log-level", "warning",
                             "--read-timeout", str(BODY_TIMEOUT_S), data_dir=data_dir, log=log)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    return Server(child.port, child.proc, data_dir, log)


def stop(srv: Server, within: float = 30.0) -> float:
    """SIGTERM the server; returns the seconds it took to exit (killed after `within` + 60 s)."""
    t0 = time.monotonic()
    if srv.proc.poll() is None:
        os.killpg(srv.proc.pid, signal.SIGTERM)
        try:
            srv.proc.wait(timeout=within + 60)
        except subprocess.TimeoutExpired:
            os.killpg(srv.proc.pid, signal.SIGKILL)
            srv.proc.wait()
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def server(tmp_path_factory, stub_url):
    """The server for the module's tests. Afterwards it must stop cleanly and start again on the data dir the fuzz
    left behind (a record the store cannot roll would show here: a slow stop, a failed start)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    stub_log = logging.getLogger("werkzeug")  # the stub's access log, one line per request, and its errors
    level = stub_log.level
    stub_log.setLevel(logging.CRITICAL)  # its tracebacks too: a 502 names the stub's 500 already
    srv = start(tmp / "data", stub_url, tmp / "server.log")
    try:
        yield srv
        problems = []
        took = stop(srv)
        if took > 30:
            problems.append(f"the server took {took:.0f} s to stop")
        try:
            again = start(tmp / "data", stub_url, tmp / "server.log")
        except pytest.fail.Exception as e:
            problems.append(f"it did not start again on the fuzzed data dir: {e}")
        else:
            try:
                status, _, data = call(again.port, "POST", "/v1/chat/completions",
                                       {"model": "m", "messages": [{"role": "user", "content": "restarted"}]})
                if status != 200:
                    problems.append(f"after a restart a chat completion answered {status}: {data[:300]!r}")
            finally:
                stop(again)
        if problems:
            pytest.fail("; ".join(problems) + f"\n--- server log (tail) ---\n{srv.log_tail(6000)}", pytrace=False)
    finally:
        stop(srv)
        stub_log.setLevel(level)


def call(port, method, path, body=None, scenario="fz-after"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    c.request(method, path, None if body is None else json.dumps(body),
              {"Content-Type": "application/json", "x-reef-scenario": scenario})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def check(report: FuzzReport, server: Server) -> None:
    """Every fuzz run's assertions; a failure prints the run's summary and the server's log tail."""
    problems = []
    if server.proc.poll() is not None:
        problems.append(f"the server exited with {server.proc.returncode}")
    for name, items in (("5xx answers", report.server_errors), ("held connections", report.held),
                        ("connections closed or reset without an answer", report.resets),
                        ("answers other than the API promises", report.unexpected)):
        if items:
            problems.append(f"{len(items)} {name}")
    code = report.by_label("scenarios/recipe-code:subprocess:Popen")
    if not code or any(o.status != 400 for o in code):
        problems.append(f"a subprocess:Popen recipe was not refused 400: {[o.status for o in code]}")
    ok = sum(1 for o in report.outcomes if o.status is not None and 200 <= o.status < 300)
    if ok < len(report.outcomes) // 5:
        problems.append(f"only {ok} requests succeeded: the run did not reach deep code")
    if problems:
        pytest.fail("; ".join(problems) + f"\n{report.summary()}\n--- server log (tail) ---\n{server.log_tail()}",
                    pytrace=False)
    # afterwards a well-formed request works, on a fresh connection, and so does a report on its receipt
    for i in range(4):  # several connections: either worker may take each
        status, headers, data = call(server.port, "POST", "/v1/chat/completions",
                                     {"model": "m", "messages": [{"role": "user", "content": f"after {i}"}]})
        assert status == 200, data
        assert json.loads(data)["choices"][0]["message"]["content"] == f"echo: after {i}"
        rid = headers.get("x-reef-agent-record-id")
        assert rid, headers
        status, _, data = call(server.port, "POST", "/reef/report", {"score": 1.0, "references": [rid]})
        assert status == 200, data
        assert json.loads(data)["agent_record_id"]


def logs_with_records(data_dir: Path) -> int:
    return sum(1 for p in (data_dir / "records").glob("log-*.bin") if read_log(p)[0])


def test_fuzz_default(server):
    cases = generate(0, 400)
    assert [c.label for c in cases] == [c.label for c in generate(0, 400)]  # the same run for the same seed
    report = run(server.url, cases, timeout=15)
    check(report, server)
    assert logs_with_records(server.data_dir) == 2, "both workers should have answered inferences"


@pytest.mark.slow
def test_fuzz_10k(server):
    report = run(server.url, generate(1, 10_000), timeout=15)
    assert len(report.outcomes) == 10_000
    check(report, server)


@pytest.mark.heavy
def test_stalled_body_gets_408(server):
    """A client that declares 100 bytes and sends 5 must not hold a server thread: 408 within the body timeout."""
    status, waited = stalled_body("127.0.0.1", server.port, declared=100, sent=5, wait=BODY_TIMEOUT_S + SLACK_S)
    assert status == 408 and waited <= BODY_TIMEOUT_S + SLACK_S, (
        f"got {status} after {waited:.1f} s; expected 408 within {BODY_TIMEOUT_S:g} s (+{SLACK_S:g} s slack)")
    status, _, data = call(server.port, "POST", "/v1/chat/completions",
                           {"model": "m", "messages": [{"role": "user", "content": "still here"}]})
    assert status == 200, data
