"""reef_lab's HTTP/1.1 server (server/httpd.py) on loopback: the protocol cases clients rely on and the limits that
answer with their own status. Raw sockets where a client library would hide the case (pipelining, 100-continue,
malformed bytes); http.client elsewhere. Through the whole gateway it is exercised by test_workers and test_crash.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from reef_lab import procs
from reef_lab.testing import free_port
from reef_lab.testing.processes import start_server
from server.httpd import ConnectionLimits, Server, listen

ROOT = Path(__file__).resolve().parents[1]


def app(environ, start_response):
    """/echo: the request's method, path, query and body; /stream: three parts, no length; /boom: raises;
    /slow: answers after 0.5 s; /stream-forever: yields until closed (records that it was closed)."""
    path = environ["PATH_INFO"]
    if path == "/boom":
        raise RuntimeError("boom")
    if path == "/slow":
        time.sleep(0.5)
    if path == "/stream":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([b"one ", b"", b"two ", b"three"])
    if path == "/stream-forever":
        start_response("200 OK", [("Content-Type", "text/event-stream")])

        def gen():
            try:
                while True:
                    yield b"data: x\n\n"
                    time.sleep(0.01)
            finally:
                closed.set()
        return gen()
    body = environ["wsgi.input"].read()
    out = (f"{environ['REQUEST_METHOD']} {path} q={environ['QUERY_STRING']} len={len(body)} "
           f"scen={environ.get('HTTP_X_REEF_SCENARIO')} ").encode() + body
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
    return [out]


closed = threading.Event()


@pytest.fixture
def server():
    """start(**limits) -> (port, Server) running in a thread."""
    running = []

    def start(**limits):
        sock = listen("127.0.0.1", 0)
        srv = Server(app, sock, ConnectionLimits(**limits))
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        running.append((srv, sock))
        return sock.getsockname()[1], srv
    yield start
    for srv, sock in running:
        srv.stop(grace=2)
        sock.close()


def raw(port: int, data: bytes, wait: float = 0.5) -> bytes:
    """Send bytes, return everything the server sends until it closes or goes quiet for `wait` s."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    s.settimeout(wait)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    s.close()
    return out


def test_keep_alive_serves_many_requests_on_one_connection(server):
    port, srv = server()
    c = http.client.HTTPConnection("127.0.0.1", port)
    for i in range(3):
        c.request("POST", f"/echo?i={i}", body=b"hello", headers={"x-reef-scenario": "s1"})
        r = c.getresponse()
        assert r.status == 200 and r.read() == f"POST /echo q=i={i} len=5 scen=s1 hello".encode()
        assert r.getheader("Date") and r.getheader("Connection") is None
    assert len(srv._conns) == 1  # one connection for all three


def test_pipelined_requests_are_answered_in_order(server):
    port, _ = server()
    req = b"GET /echo?n=%d HTTP/1.1\r\nHost: x\r\n\r\n"
    out = raw(port, req % 1 + req % 2 + req % 3)
    assert out.count(b"HTTP/1.1 200 OK") == 3
    assert out.index(b"q=n=1") < out.index(b"q=n=2") < out.index(b"q=n=3")


def test_chunked_request_body_is_read_whole(server):
    port, _ = server()
    out = raw(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    assert b"len=11" in out and out.endswith(b"hello world")


def test_expect_100_continue_gets_the_interim_answer_before_the_body(server):
    port, _ = server()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    s.settimeout(2)
    assert s.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
    s.sendall(b"body")
    assert s.recv(4096).endswith(b"len=4 scen=None body")
    s.close()


def test_a_stream_goes_out_chunked_and_close_delimited_for_http_1_0(server):
    port, _ = server()
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("GET", "/stream")
    r = c.getresponse()
    assert r.getheader("Transfer-Encoding") == "chunked" and r.read() == b"one two three"
    c.request("GET", "/echo")  # the connection is still usable after a chunked answer
    assert c.getresponse().read().startswith(b"GET /echo")
    out = raw(port, b"GET /stream HTTP/1.0\r\n\r\n")
    assert b"Connection: close" in out and b"chunked" not in out and out.endswith(b"one two three")


def test_head_sends_no_body(server):
    port, _ = server()
    out = raw(port, b"HEAD /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("data, status, says", [
    (b"BLAH\x01 / HTTP/1.1\r\n\r\n", b"400", b"malformed HTTP request"),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", b"431", b"larger than 65536 bytes"),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 70_000, b"431", b"larger than 65536 bytes"),  # never ends
    (b"POST /echo HTTP/1.1\r\nContent-Length: 2000\r\n\r\n", b"413", b"(2000 bytes) is larger"),
    (b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"a" * 1024 + b"\r\n",
     b"413", b"larger than this server takes (1000 bytes)"),
])
def test_bad_requests_get_their_status_and_a_reason(server, data, status, says):
    port, _ = server(body_bytes=1000)
    out = raw(port, data)
    assert out.startswith(b"HTTP/1.1 " + status) and says in out and b"Connection: close" in out


def test_a_request_whose_headers_trickle_in_is_cut_with_408(server):
    port, _ = server(header_timeout=0.5)
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(3)
    t0 = time.monotonic()
    s.sendall(b"GET / HTTP/1.1\r\n")
    out = b""
    for _ in range(20):  # one header byte every 0.1 s: each recv is quick, the whole is too slow
        try:
            s.sendall(b"X")
        except OSError:
            break
        time.sleep(0.1)
    while chunk := s.recv(4096):
        out += chunk
    assert out.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 2.5


def test_idle_keep_alive_connection_is_closed_quietly(server):
    port, _ = server(keepalive_timeout=0.3)
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(2)
    assert s.recv(10) == b""  # closed without an answer: nothing was asked


def test_more_connections_than_the_limit_are_answered_503(server):
    port, _ = server(max_connections=1)
    first = http.client.HTTPConnection("127.0.0.1", port)
    first.request("GET", "/echo")
    assert first.getresponse().read()
    out = raw(port, b"GET /echo HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 503") and b"maximum of 1 connections" in out
    first.request("GET", "/echo")  # the held connection still works
    assert first.getresponse().status == 200


def test_an_app_error_is_a_500_and_serving_goes_on(server):
    port, _ = server()
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("GET", "/boom")
    r = c.getresponse()
    assert r.status == 500 and b"internal server error" in r.read()
    c = http.client.HTTPConnection("127.0.0.1", port)
    c.request("GET", "/echo")
    assert c.getresponse().status == 200


def test_a_client_leaving_mid_stream_closes_the_apps_iterable(server):
    port, _ = server()
    closed.clear()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /stream-forever HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"data: x" in s.recv(4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset on close
    s.close()
    assert closed.wait(5)


def test_stop_lets_a_request_in_progress_finish(server):
    port, srv = server()
    c = http.client.HTTPConnection("127.0.0.1", port)
    got = {}

    def slow():
        c.request("GET", "/slow")
        r = c.getresponse()
        got["status"], got["connection"] = r.status, r.getheader("Connection")
    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.2)
    idle = socket.create_connection(("127.0.0.1", port))
    time.sleep(0.1)
    srv.stop(grace=5)
    t.join(5)
    assert got["status"] == 200
    idle.settimeout(2)
    assert idle.recv(10) == b""  # the idle connection was closed
    late = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    late.request("GET", "/echo")
    with pytest.raises(OSError):  # no longer taken: the kernel queues it, nobody answers
        late.getresponse()


@pytest.mark.heavy
def test_a_dead_relay_is_replaced_and_a_dead_primary_restarts_all_with_no_record_lost(tmp_path, stub_url):
    srv = start_server("--upstream-url", stub_url, "--workers", "2", "--log-level", "warning",
                       data_dir=tmp_path / "d", log=tmp_path / "serve.log")
    port, proc = srv.port, srv.proc
    receipts = []

    def traffic(n=10):  # each request on a new connection, so both workers take some
        for _ in range(n):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("POST", "/v1/chat/completions", body=b'{"model": "m", "messages": []}',
                      headers={"x-reef-scenario": "s", "Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            assert r.status == 200
            receipts.append(r.getheader("x-reef-agent-record-id"))
    try:
        primary, relay = _roles(srv.pid, port)
        traffic()
        os.kill(relay, signal.SIGKILL)
        primary2, relay2 = _roles(srv.pid, port, gone=relay)
        assert primary2 == primary and relay2 != relay  # only the relay was replaced
        traffic()
        os.kill(primary, signal.SIGKILL)
        primary3, relay3 = _roles(srv.pid, port, gone=primary)
        assert {primary3, relay3}.isdisjoint({primary, relay2})  # all restarted
        traffic()
        for rid in receipts:  # every receipt, from all three generations of workers, is still there
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", f"/reef/scenarios/s/records/{rid}")
            assert c.getresponse().status == 200, rid
    finally:
        srv.stop()
    err = (tmp_path / "serve.log").read_bytes()
    assert proc.returncode == 0, err[-2000:]
    assert b"starting another" in err and b"restarting all workers" in err and b"Traceback" not in err


@pytest.mark.heavy
def test_a_worker_that_cannot_start_stops_the_server_with_its_reason(tmp_path):
    port = free_port()
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "serve.py"), "--port", str(port), "--data-dir",
                          str(tmp_path / "d"), "--model-path", str(tmp_path / "no-such-model")],
                         cwd=ROOT, capture_output=True, timeout=120)
    assert out.returncode == 1
    assert b"no-such-model" in out.stderr and b"before it was ready" in out.stderr


def test_an_upgrade_request_is_answered_plainly_and_the_connection_closed(server):
    port, _ = server()
    out = raw(port, b"GET /echo HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nGARBAGE")
    assert out.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in out and out.count(b"HTTP/1.1") == 1


def test_a_taken_port_is_refused_with_what_to_do():
    held = listen("127.0.0.1", 0)
    port = held.getsockname()[1]
    with pytest.raises(SystemExit, match="choose another --port"):
        listen("127.0.0.1", port)
    held.close()


def _roles(parent: int, port: int, gone: int | None = None, timeout: float = 60) -> tuple[int, int]:
    """(primary pid, relay pid) of a two-worker server once both serve (the primary holds .primary.lock)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        kids = procs.children(parent)  # the workers (each started through a reef_lab.procs reaper)
        if len(kids) == 2 and gone not in kids:
            holds = [k for k in kids if _holds(k, ".primary.lock")]
            if len(holds) == 1:
                _wait_healthy(port)
                time.sleep(1.5)  # the relay is ready shortly after the primary
                return holds[0], next(k for k in kids if k != holds[0])
        time.sleep(0.1)
    raise AssertionError(f"two workers of {parent} did not come up")


def _holds(pid: int, suffix: str) -> bool:
    for f in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(f).endswith(suffix):
                return True
        except OSError:  # an fd closed meanwhile
            pass
    return False


def _wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.heavy
def test_a_clean_stop_of_a_training_server_prints_no_traceback(tmp_path):
    """Issue 38 item 16: a scenario with a W&B run (offline), stopped by SIGTERM, printed wandb's ConnectionResetError
    traceback at every clean shutdown (W&B's own exit handler ended its service before the tracker finished)."""
    server = start_server("--model-path", "tiny", "--recipe", "sft", "--recipe-config", "{mode: manual}",
                          data_dir=tmp_path / "data", log=tmp_path / "serve.log", env={"WANDB_MODE": "offline"})
    try:
        h = {"x-reef-scenario": "s"}
        r = requests.post(server.url + "/v1/chat/completions", headers=h, timeout=120,
                          json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        receipt = r.headers["x-reef-agent-record-id"]
        r = requests.post(server.url + "/reef/report", headers=h, timeout=60, json={"score": 1, "references": [receipt]})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 120  # the learner starts its W&B run (a wandb-core service process)

        def started() -> bool:
            return any("run started" in p.read_text(errors="replace")
                       for p in (tmp_path / "data" / "wandb").glob("offline-run-*/logs/debug.log"))
        while not started() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert started(), server.log_tail()
    finally:
        server.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "closed the gateway" in log and "Traceback" not in log and "did not finish cleanly" not in log, log[-3000:]
