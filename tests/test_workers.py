"""Several worker processes (`scripts/serve.py --workers 2 --upstream-url ...`): a primary and a relay.

Real processes under granian, the real openai SDK, the stub provider on loopback. Each request opens its own
connection so that both workers take traffic (the kernel hands connections to whichever worker accepts first);
the tests check that both did, then that the primary knows every receipt a relay handed out, that a harness
release reaches the relay's next requests, and that streams and management routes work through either worker.
"""

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from reef_lab.records.store import RecordStore, read_log
from reef_lab import procs
from reef_lab.testing.processes import start_server

ROOT = Path(__file__).resolve().parents[1]


def start(data_dir, stub_url, env=None, *flags):
    srv = start_server("--upstream-url", stub_url, "--workers", "2", "--log-level", "warning", *flags,
                       data_dir=data_dir, log=Path(str(data_dir) + "-serve.log"), env=env)
    return srv.port, srv


def stop(srv):
    srv.stop()


@pytest.fixture
def two_workers(tmp_path, stub_url):
    port, proc = start(tmp_path / "data", stub_url)
    yield port, tmp_path / "data", proc
    stop(proc)


def call(port, method, path, body=None, scenario="w", token=None):
    """One request on a fresh connection (so successive calls land on either worker)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json", "x-reef-scenario": scenario}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    c.request(method, path, None if body is None else json.dumps(body), headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def chat(port, text, scenario="w"):
    return call(port, "POST", "/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": text}]}, scenario)


def logs_with_records(data_dir) -> int:
    return sum(1 for p in (Path(data_dir) / "records").glob("log-*.bin") if read_log(p)[0])


def chat_until_both_answer(port, data_dir, at_least: int) -> list[str]:
    """At least `at_least` chats, more until both workers have answered some (each writes its own log: two logs with
    records). Which worker accepts a connection is the kernel's choice; on a busy machine one can take a long run of
    them, so this asks up to 600 times before it fails."""
    receipts = []
    while len(receipts) < at_least or logs_with_records(data_dir) < 2 and len(receipts) < 600:
        i = len(receipts)
        status, headers, data = chat(port, f"q{i}")
        assert status == 200, data
        assert json.loads(data)["choices"][0]["message"]["content"] == f"echo: q{i}"
        receipts.append(headers["x-reef-agent-record-id"])
    assert logs_with_records(data_dir) == 2, f"one worker answered all {len(receipts)} requests"
    return receipts


def test_both_workers_serve_and_the_primary_knows_every_receipt(two_workers):
    port, data_dir, _ = two_workers
    receipts = chat_until_both_answer(port, data_dir, 60)
    n = len(receipts)
    # Reports (always taken by the primary) may reference any worker's receipts.
    for i in range(0, n, 2):
        status, _, data = call(port, "POST", "/reef/report", {"score": 1.0, "references": receipts[i:i + 2]})
        assert status == 200, data
    for _ in range(6):  # refused alike by either worker, in the API's error format
        status, _, data = call(port, "POST", "/reef/report", {"score": 1.0, "references": ["rec_nope"]})
        assert status == 400 and json.loads(data)["detail"] == "reference 'rec_nope' is not a known receipt"
        status, _, data = call(port, "POST", "/reef/report", {"score": True})
        assert status == 400 and "finite number" in json.loads(data)["detail"]
    for rid in receipts[::7]:
        status, _, data = call(port, "GET", f"/reef/scenarios/w/records/{rid}")
        assert status == 200 and json.loads(data)["id"] == rid
    for _ in range(4):  # a query string passed on by a relay reads the same
        status, _, data = call(port, "GET", "/reef/scenarios/w/records?kind=inference&limit=1000")
        assert status == 200
        listed = {r["id"] for r in json.loads(data)["records"]}
        assert set(receipts) <= listed
    status, _, data = call(port, "GET", "/reef/scenarios/w")
    assert json.loads(data)["records"] == {"inference": n, "report": (n + 1) // 2, "train": 0, "eval": 0}


def test_an_episode_spans_both_workers_in_order(two_workers):
    """One session's calls land on either worker (each writes its own log); the episode reads back whole, its turns
    in the order the calls were made, and refusals by either worker are recorded in it."""
    port, data_dir, _ = two_workers
    assert chat(port, "warm", "ep")[0] == 200  # the scenario exists: both workers serve it from here on

    def session_call(body):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/v1/chat/completions", json.dumps(body), {
            "Content-Type": "application/json", "x-reef-scenario": "ep", "x-reef-session": "run-1"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data
    receipts = []
    # at least 24 calls, more until both workers have answered some: on a busy machine the kernel can hand one
    # worker a long run of connections (as in chat_until_both_answer)
    while len(receipts) < 24 or logs_with_records(data_dir) < 2 and len(receipts) < 600:
        i = len(receipts)
        status, headers, data = session_call({"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]})
        assert status == 200 and headers["x-reef-episode"] == "run-1", data
        receipts.append(headers["x-reef-agent-record-id"])
    for _ in range(4):
        status, _, data = session_call({"model": "m", "messages": "not a list"})
        assert status == 400, data
    assert logs_with_records(data_dir) == 2, f"one worker answered all {len(receipts)} calls"
    status, _, data = call(port, "GET", "/reef/episodes/run-1", None, "ep")
    assert status == 200, data
    ep = json.loads(data)
    answered = [r for r in ep["records"] if r["status"] == "ok"]
    n = len(receipts)
    assert [r["id"] for r in answered] == receipts and [r["turn"] for r in ep["records"]] == list(range(1, n + 5))
    assert [r["request"]["messages"][0]["content"] for r in answered] == [f"q{i}" for i in range(n)]
    assert [r["status"] for r in ep["records"]].count("refused") == 4
    status, _, data = call(port, "POST", "/reef/report", {"score": 1.0, "episode": "run-1"}, "ep")
    assert status == 200, data


@pytest.mark.heavy
def test_sdk_streams_and_harness_releases_through_either_worker(two_workers):
    port, data_dir, _ = two_workers
    for i in range(4):  # the scenario exists from here on, so both workers serve its requests
        assert chat(port, "warm", "h")[0] == 200
    status, _, data = call(port, "POST", "/reef/scenarios/h/harness",
                           {"files": {"system_prompt.md": "You are terse."}}, "h")
    assert status == 201, data
    release = json.loads(data)["release_id"]
    before = logs_with_records(data_dir)
    for i in range(30):  # the relay re-reads the serving harness after the primary's change
        status, headers, data = chat(port, "!system", "h")
        assert status == 200
        assert headers["x-reef-release-id"] == release
        assert json.loads(data)["choices"][0]["message"]["content"] == "system: You are terse."
    assert before == 2 or logs_with_records(data_dir) == 2
    for i in range(10):  # a client that carries the release in its own files (x-reef-harness): neither worker applies it
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "messages": [
            {"role": "system", "content": "mine"}, {"role": "user", "content": "!system"}]}),
            {"Content-Type": "application/json", "x-reef-scenario": "h", "x-reef-harness": release})
        r = c.getresponse()
        data = r.read()
        c.close()
        assert r.status == 200 and r.getheader("x-reef-release-id") == release
        assert json.loads(data)["choices"][0]["message"]["content"] == "system: mine"
    status, _, data = call(port, "GET", "/reef/harness", None, "h")
    assert json.loads(data)["release_id"] == release

    for i in range(6):  # a scenario's first request, streamed: a relay passes it on and streams the answer back
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                          default_headers={"x-reef-scenario": f"new-{i}"})
        chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "first"}],
                                                stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices).strip() == "echo: first"
        assert chunks[-1].model_extra["reef"]["agent_record_id"].startswith("rec_")
        c.close()
    receipts = []
    for i in range(10):  # a new client (connection) per stream: both workers stream
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                          default_headers={"x-reef-scenario": "h"})
        chunks = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"s{i}"}],
                                                stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text.strip() == f"echo: s{i}"
        receipts.append(chunks[-1].model_extra["reef"]["agent_record_id"])
        c.close()
    status, _, data = call(port, "POST", "/reef/report", {"score": 0.5, "references": receipts}, "h")
    assert status == 200, data


@pytest.mark.heavy
def test_records_survive_a_restart_with_relay_logs(tmp_path, two_workers):
    port, data_dir, proc = two_workers
    receipts = chat_until_both_answer(port, data_dir, 40)
    # kill -9 the whole server: the relay's log is then a dead writer's, which the next primary rolls
    os.killpg(proc.group, signal.SIGKILL)
    proc.wait()
    store = RecordStore(data_dir)
    assert all(store.entry(r) is not None for r in receipts)
    store.close()


def test_a_server_starts_while_the_last_primary_still_holds_the_lock(tmp_path, stub_url):
    """A restart while the previous server's primary is still exiting (it holds .primary.lock for a moment): the
    new workers must not all settle for relaying to nobody; one becomes the primary once the lock frees."""
    import threading
    from server.workers import claim_primary
    data_dir = tmp_path / "data"
    held = claim_primary(data_dir)  # this test process plays the old primary, still exiting
    assert held is not None
    threading.Timer(3.0, held.close).start()
    srv = start_server("--upstream-url", stub_url, "--workers", "2", "--log-level", "warning", data_dir=data_dir,
                       log=tmp_path / "serve.log", timeout=60)
    try:
        for scenario in ("a", "b", "c", "d"):  # answered, and recorded by the primary, through either worker
            status, _, body = chat(srv.port, "hi", scenario)
            assert status == 200, body
    finally:
        stop(srv)


def test_several_workers_need_an_upstream_provider():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py"), "--workers", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "workers above 1 need upstream_url" in out.stderr


@pytest.mark.heavy
def test_every_route_needs_the_token_on_either_worker(tmp_path, stub_url):
    port, proc = start(tmp_path / "data", stub_url, {"REEF_TOKEN": "sekrit"})
    try:
        msg = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        rid = None
        for _ in range(8):
            assert call(port, "POST", "/v1/chat/completions", msg)[0] == 401
            assert call(port, "POST", "/reef/report", {"score": 1.0})[0] == 401
            assert call(port, "GET", "/reef/scenarios")[0] == 401
            status, headers, _ = call(port, "POST", "/v1/chat/completions", msg, token="sekrit")
            assert status == 200
            rid = headers["x-reef-agent-record-id"]
            assert call(port, "POST", "/reef/report", {"score": 1.0, "references": [rid]}, token="sekrit")[0] == 200
        assert call(port, "GET", "/healthz")[0] == 200
    finally:
        stop(proc)


@pytest.mark.heavy
def test_workers_threads_ask_for_a_short_time_slice(tmp_path, stub_url):
    """Every thread of both workers, those started after the worker was built included, carries the 100 us slice
    (`--sched-slice-us 100`, opt-in; `--sched-slice-busy 1` keeps it however busy the machine is); skipped where the
    kernel has no custom slices (before Linux 6.12)."""
    from server.tuning import thread_slice_us
    if thread_slice_us() is None:
        pytest.skip("sched_getattr is not available here")
    port, srv = start(tmp_path / "data", stub_url, None, "--sched-slice-us", "100", "--sched-slice-busy", "1")
    try:
        for _ in range(8):  # traffic on new connections: request threads start in both workers
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", "/v1/chat/completions", body=json.dumps({"model": "m", "messages": []}),
                      headers={"x-reef-scenario": "slice", "Content-Type": "application/json"})
            assert c.getresponse().status == 200
        kids = procs.children(srv.pid)  # the workers (each below a reef_lab.procs reaper)
        assert len(kids) == 2
        slices = {int(t): thread_slice_us(int(t)) for k in kids for t in os.listdir(f"/proc/{k}/task")}
        slices = {t: v for t, v in slices.items() if v is not None}  # None: a thread that ended meanwhile
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
        if (major, minor) < (6, 12) and set(slices.values()) != {100}:
            pytest.skip(f"kernel {os.uname().release} has no custom slices")
        assert len(slices) > 4 and set(slices.values()) == {100}, slices
    finally:
        srv.stop()


GOVERNOR = """
import os, sys, time, threading
from server.tuning import SliceGovernor, thread_slice_us
share = [0.0]  # the machine's busy share as the governor reads it: the test says it, the real machine may be busy
gov = SliceGovernor(100, busy=0.6, period=0.05, load=lambda: share[0])
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a thread besides the main one
def slices():
    return {thread_slice_us(int(t)) for t in os.listdir("/proc/self/task")} - {None}
print("start", sorted(slices()), flush=True)
for line in sys.stdin:  # the test says when the CPUs are busy or idle again
    want_default = line.strip() == "busy"
    share[0] = 1.0 if want_default else 0.1
    # the governor sets one thread after another: wait for every thread, not the first, to reach the new slice
    reached = (lambda s: 100 not in s) if want_default else (lambda s: s == {100})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not reached(slices()):
        time.sleep(0.02)
    print(line.strip(), sorted(slices()), flush=True)
"""


def test_threads_give_the_short_slice_back_while_the_machine_is_saturated():
    """With every CPU busy the governor puts all threads back on the kernel's default slice, and on the short
    one again once the CPUs idle (server/tuning.py SliceGovernor). The load the governor reads is the test's, so
    that the test holds on a machine that other work keeps busy; tests/test_workers.py::test_machine_load_reads_
    proc_stat checks the real reading."""
    from server.tuning import thread_slice_us
    if thread_slice_us() is None:
        pytest.skip("sched_getattr is not available here")
    root = Path(__file__).resolve().parents[1]
    gov = subprocess.Popen([sys.executable, "-c", GOVERNOR], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        first = json.loads(gov.stdout.readline().split(" ", 1)[1])
        if first != [100]:
            pytest.skip(f"kernel {os.uname().release} has no custom slices: {first}")
        for state in ("busy", "idle", "busy", "idle"):
            gov.stdin.write(state + "\n")
            gov.stdin.flush()
            word, seen = gov.stdout.readline().split(" ", 1)
            assert word == state and (100 in json.loads(seen)) == (state == "idle"), (state, seen)
            if state == "idle":
                assert json.loads(seen) == [100], seen
    finally:
        gov.kill()
        gov.wait()


def test_machine_load_reads_proc_stat():
    """The governor's default load: None before it has two readings' worth of counters, then a share in [0, 1]
    that counts this process's own spinning as busy time."""
    from server.tuning import MachineLoad, cpu_ticks
    if not cpu_ticks():
        pytest.skip("/proc/stat is not readable here")
    load = MachineLoad()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        pass  # one CPU busy for 0.3 s, whatever the others do
    share = load()
    assert share is not None and 1 / (os.cpu_count() or 1) * 0.5 <= share <= 1.0, share
