"""Several worker processes behind one port when reef_lab proxies a provider: one primary, the others relays.

Why: a Python process runs one thread of request handling at a time (the GIL), and with an instant provider one
process tops out near a core (scripts/bench/bench_gateway.py). Relaying to a provider is the one job that needs
neither the model nor the learners in-process, so it can be spread over processes; everything with state stays
in one place.

- The **primary** (the worker that takes `<data dir>/.primary.lock` first) runs the whole app: gateway, record
  store, scenarios, releases, learners. It also listens on a private unix socket for its relays.
- A **relay** serves inference of existing scenarios itself: the serving harness (asked of the primary once and
  kept until the change counter in `<data dir>/.serving-gen` moves), the upstream call, the record. It writes its
  records to a log of its own (`reef_lab.records.store.RelayLog`: group commit, fdatasync before the receipt leaves), which the
  primary's store follows: it reads the log as it grows (on an unknown receipt, before every query, each second),
  serves those records like its own and rolls the log into Parquet once the relay has closed it. Sending each
  record to the primary instead was no faster than one process (results/log/gateway-notes.md). A report is checked for
  auth and scope and parsed here, then validated and stored by the primary (one small message, with the token's id
  and whether it may report only on its own receipts; the primary knows every receipt). Every other request
  (scenario and record routes, a scenario's first request) is passed to the primary whole and its answer
  streamed back, so there is one index, one scenario registry and one set of learners.

Wire format on the socket: frames of `<u32 length><bytes>`; a message is a JSON header frame plus one body frame.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import logging
import mmap
import os
import socket
import struct
import sys
import threading
import time
from http import HTTPStatus
from pathlib import Path
from typing import Iterator

import orjson

from reef_lab.harness import tree as harness_mod
from reef_lab.errors import BadRequest, ReefError
from reef_lab.gateway import episodes, unanswered
from reef_lab.gateway.gateway import Gateway
from reef_lab.gateway.inference import Relaying
from reef_lab.scenarios import check_name
from reef_lab.records.store import RelayLog
from reef_lab.wire import dialects
from reef_lab.tenants import Tenants
from server.common import DEFAULT_LIMITS, RequestLimits, admit, error_body, read_body

log = logging.getLogger("reef_lab.server")

_LEN = struct.Struct("<I")
_PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid (SO_PEERCRED)
GEN_FILE = ".serving-gen"


def claim_primary(data_dir: str | Path):
    """The open lock file when this process is the primary (keep it open for the process's life), else None."""
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    f = open(Path(data_dir) / ".primary.lock", "a+b")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def claim_or_find_primary(data_dir: str | Path, timeout: float = 600):
    """The lock when this worker becomes the primary; None once a primary answers on the data dir's socket.

    Why both, retried: a primary of the previous server on this data dir can hold the lock for a moment after its
    server stopped; a worker that then settled for relaying would wait for a primary that never comes, and the
    server would never answer (seen as a restart that did not start under load)."""
    deadline = time.monotonic() + timeout
    while True:
        lock = claim_primary(data_dir)
        if lock is not None:
            return lock
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(socket_address(data_dir))
            return None
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no primary worker answered for {data_dir} and its lock stayed held: is "
                                   f"another server still running on that data dir?") from None
            time.sleep(0.05)
        finally:
            s.close()


def socket_address(data_dir: str | Path) -> str:
    """An abstract unix socket name per data dir (no file to clean up, no 108-byte path limit)."""
    key = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:20]
    return f"\0reef_lab-{key}"


_GEN = struct.Struct("<Q")


def _gen_counter(data_dir: str | Path, writable: bool) -> mmap.mmap:
    """The change counter in `<data dir>/.serving-gen`, mapped into memory: the primary adds one after each change
    of scenarios or serving harnesses, and a relay reads it on every request without a system call."""
    path = Path(data_dir) / GEN_FILE
    if writable:
        with open(path, "a+b") as f:
            if os.fstat(f.fileno()).st_size < _GEN.size:
                f.truncate(_GEN.size)
    with open(path, "r+b" if writable else "rb") as f:
        return mmap.mmap(f.fileno(), _GEN.size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)


# ---- framing ----------------------------------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the other worker closed the connection")
        buf += chunk
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> bytes:
    return _recv_exact(sock, _LEN.unpack(_recv_exact(sock, 4))[0])


def _send_message(sock: socket.socket, header: dict, body: bytes = b"") -> None:
    h = orjson.dumps(header)
    sock.sendall(_LEN.pack(len(h)) + h + _LEN.pack(len(body)) + body)


def _recv_message(sock: socket.socket) -> tuple[dict, bytes]:
    header = orjson.loads(_recv_frame(sock))
    return header, _recv_frame(sock)


# ---- primary side -----------------------------------------------------------------------------------------------
class PrimaryBridge:
    """The primary's end of the socket: a thread per relay connection runs its requests against the app."""

    def __init__(self, app, gateway: Gateway, data_dir: str | Path):
        self.app, self.gateway = app, gateway
        self._gen = _gen_counter(data_dir, writable=True)
        self._gen_lock = threading.Lock()
        self.bump()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(socket_address(data_dir))
        self._sock.listen(256)
        gateway.on_change = self.bump
        gateway.store.follow_relays()
        threading.Thread(target=self._accept, name="reef-primary-bridge", daemon=True).start()

    def bump(self) -> None:
        """Count a change of scenarios or serving harnesses; relays see the new count and ask again."""
        with self._gen_lock:
            _GEN.pack_into(self._gen, 0, _GEN.unpack_from(self._gen)[0] + 1)

    def _accept(self) -> None:
        """Connections of processes of this server's own user only: an abstract socket has no file permissions, and
        a relay's report message names its token's id and rights (such a process can read the data dir anyway)."""
        while True:
            conn, _ = self._sock.accept()
            pid, uid, _ = _PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
            if uid != os.getuid():
                log.warning("refused a connection to the primary's socket from pid %d of uid %d", pid, uid)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="reef-relay-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while True:
                header, body = _recv_message(conn)
                op = header.get("op")
                if op == "serving":
                    try:
                        _send_message(conn, {"serving": self.gateway.serving(header["scenario"])})
                    except Exception as e:  # noqa: BLE001 - the relay hands the request over, which reports it
                        _send_message(conn, {"serving": None, "error": str(e)})
                elif op == "report":
                    self._report(conn, header, body)
                elif op == "wsgi":
                    self._wsgi(conn, header, body)
                else:
                    raise ConnectionError(f"unknown op {op!r}")
        except (ConnectionError, OSError):
            pass
        except Exception:
            log.exception("relay connection failed")
        finally:
            conn.close()

    def _report(self, conn: socket.socket, header: dict, body: bytes) -> None:
        try:
            created, rid = self.gateway.report(header["scenario"], orjson.loads(body), header["tags"],
                                               caller=header.get("caller"), only_own=header.get("only_own", False),
                                               scoped_ids=header.get("scoped_ids", False))
            _send_message(conn, {"created": created, "id": rid})
        except ReefError as e:
            _send_message(conn, {"error": e.message, "status": e.status, "type": e.type})
        except Exception as e:  # noqa: BLE001 - a bug: logged, answered 500, the connection stays usable
            log.exception("unhandled error on a relayed report")
            _send_message(conn, {"error": f"internal error: {type(e).__name__}: {e}", "status": 500,
                                 "type": "server_error"})

    def _wsgi(self, conn: socket.socket, header: dict, body: bytes) -> None:
        environ = dict(header["environ"])
        environ.update({"wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.version": (1, 0),
                        "wsgi.url_scheme": environ.get("wsgi.url_scheme", "http"), "wsgi.multithread": True,
                        "wsgi.multiprocess": True, "wsgi.run_once": False, "wsgi.input_terminated": True,
                        "CONTENT_LENGTH": str(len(body))})
        started: dict = {}

        def start_response(status, headers, exc_info=None):
            started.update(status=status, headers=[list(h) for h in headers])
        rv = self.app(environ, start_response)
        try:
            it, first = iter(rv), b""
            for chunk in it:  # a WSGI app may call start_response only once it yields
                if chunk:
                    first = chunk
                    break
            _send_message(conn, {"status": started["status"], "headers": started["headers"]}, first)
            for chunk in it:
                if chunk:
                    conn.sendall(_LEN.pack(len(chunk)) + chunk)
            conn.sendall(_LEN.pack(0))
        finally:
            if hasattr(rv, "close"):
                rv.close()


# ---- relay side -------------------------------------------------------------------------------------------------
class PrimaryClient:
    """A relay's keep-alive connections to its primary, reused last-in first-out by any thread."""

    def __init__(self, data_dir: str | Path, tenants: Tenants | None = None, limits: RequestLimits = DEFAULT_LIMITS):
        self.address = socket_address(data_dir)
        self._idle: list[socket.socket] = []
        self.tenants, self.limits = tenants or Tenants(), limits

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._idle.append(self._connect())
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the primary worker did not open its socket; see its log") from None
                time.sleep(0.05)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.address)
        return s

    def _take(self) -> socket.socket:
        try:
            return self._idle.pop()
        except IndexError:
            return self._connect()

    def call(self, header: dict, body: bytes = b"") -> dict:
        """One request and its one-message answer."""
        sock = self._take()
        try:
            _send_message(sock, header, body)
            out, _ = _recv_message(sock)
        except BaseException:
            sock.close()
            raise
        self._idle.append(sock)
        return out

    def forward(self, environ, start_response) -> Iterator[bytes] | list[bytes]:
        """Hand a whole HTTP request to the primary; its answer (streams included) goes back as it comes. The
        request is admitted and its body read here under the same rules the primary applies."""
        path = environ.get("PATH_INFO", "")
        try:
            if path != "/healthz":
                admit(environ, self.tenants, self.limits)
            body = read_body(environ, self.limits.for_path(path))
        except ReefError as e:
            msg = error_body(path, e)
            start_response(f"{e.status} {HTTPStatus(e.status).phrase}", [("Content-Type", "application/json"),
                                                                        ("Content-Length", str(len(msg)))])
            return [msg]
        cgi = {k: v for k, v in environ.items() if isinstance(v, str) and not k.startswith("wsgi.")}
        cgi["wsgi.url_scheme"] = environ.get("wsgi.url_scheme", "http")
        try:
            sock = self._take()
            _send_message(sock, {"op": "wsgi", "environ": cgi}, body)
            head, first = _recv_message(sock)
        except OSError as e:
            msg = orjson.dumps({"error": {"message": f"the primary worker is unavailable: {e}",
                                          "type": "server_error"}})
            start_response("503 Service Unavailable", [("Content-Type", "application/json"),
                                                       ("Content-Length", str(len(msg)))])
            return [msg]
        start_response(head["status"], [tuple(h) for h in head["headers"]])
        if any(k.lower() == "content-length" for k, _ in head["headers"]):
            parts = [first]  # a sized body: read it whole, hand granian one list (server/hot.py whole_bodies)
            while part := _recv_frame(sock):
                parts.append(part)
            self._idle.append(sock)
            return [b"".join(parts)]
        return self._stream(sock, first)

    def _stream(self, sock: socket.socket, first: bytes) -> Iterator[bytes]:
        done = False
        try:
            if first:
                yield first
            while part := _recv_frame(sock):
                yield part
            done = True
        finally:
            if done:
                self._idle.append(sock)
            else:
                sock.close()  # the client left mid-stream: the primary sees the close and stops


class RelayGateway:
    """The slice of Gateway a relay runs: inference of existing scenarios through the upstream engine."""

    def __init__(self, engine, client: PrimaryClient, data_dir: str | Path, roll_records: int = 20_000,
                 roll_bytes: int = 64 << 20, store=None):
        """`store`: where its records go (a shared deployment's PgRecordStore); default: a log of its own in the
        data dir, which the primary follows."""
        self.engine, self.client = engine, client
        self.store = store if store is not None else RelayLog(data_dir, roll_records, roll_bytes)
        self._relaying = Relaying(engine, self.store)
        self.started_at = time.time()
        self._gen_map = _gen_counter(data_dir, writable=False)
        self._gen = -1
        self._serving: dict[str, dict] = {}

    def _fresh(self) -> None:
        gen = _GEN.unpack_from(self._gen_map)[0]
        if gen != self._gen:
            self._serving = {}
            self._gen = gen

    def serving(self, scenario: str | None) -> dict | None:
        """The scenario's serving harness, or None when the primary should take the request."""
        self._fresh()
        info = self._serving.get(scenario)  # type: ignore[arg-type]
        if info is None:
            try:
                check_name(scenario)
            except BadRequest:
                return None
            try:
                info = self.client.call({"op": "serving", "scenario": scenario}).get("serving")
            except OSError:
                return None
            if info is not None:
                self._serving[scenario] = info
        return info

    def infer(self, dialect: str, body, scenario: str | None, tags: dict[str, str] | None = None,
              client_headers: dict[str, str] | None = None, caller: str | None = None, creator: str | None = None):
        """`creator` is unused: a relay serves existing scenarios only (a new one is the primary's to create)."""
        name = check_name(scenario)
        t0, episode = time.perf_counter(), None
        try:  # [episodes hook] a 4xx is recorded as refused, as the primary does (reef_lab/gateway/unanswered.py)
            episode = episodes.detect(client_headers, body)
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            info = self.serving(name) or {"release_id": None, "system": None}
            harness = info["system"] is not None  # the primary parsed it once, at release
            installed = harness_mod.installed_release(name, client_headers)  # the client carries it (harness/install)
            sent = dialects.with_system(dialect, body, info["system"]) if harness and not installed else body
            release = (installed or info["release_id"]) if harness else info["release_id"]
            return self._relaying.relay(dialect, body, name, tags or {}, client_headers or {}, sent,
                                        release or "upstream", caller=caller)
        except ReefError as e:
            if unanswered.is_refusal(e):
                unanswered.record_refused(self.store, name, dialect, body, tags or {}, t0, e, episode, caller=caller)
            raise

    def report(self, scenario: str | None, body, tags: dict[str, str] | None = None, caller: str | None = None,
               only_own: bool = False, scoped_ids: bool = False) -> tuple[bool, str]:
        """Validated and stored by the primary (it holds the index of receipts); auth and scope were checked here,
        and the primary takes `caller`, `only_own` and `scoped_ids` from this worker (it takes connections only from
        processes of its own user: PrimaryBridge)."""
        try:
            out = self.client.call({"op": "report", "scenario": scenario, "tags": tags or {}, "caller": caller,
                                    "only_own": only_own, "scoped_ids": scoped_ids}, orjson.dumps(body))
        except OSError as e:
            raise ReefError(f"the primary worker is unavailable: {e}", status=503) from None
        if "error" in out:
            err = ReefError(out["error"], status=out["status"])
            err.type = out["type"]
            raise err
        return out["created"], out["id"]
