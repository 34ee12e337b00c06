"""reef_lab's HTTP/1.1 server: worker processes share one listening socket, and each connection gets a thread that
reads, runs and answers its own requests.

Why not a server with an event loop in front of a thread pool (granian, which served reef_lab before, and
likewise cheroot, waitress, gunicorn's gthread): there every request crosses threads twice (loop to pool and back),
and on these VMs each cross-thread wakeup is a trip through the scheduler, so a thread per connection answers
sooner (results/log/gateway-notes.md); `scripts/bench/bench_gateway.py --compare-granian` measures both in front of reef_lab. An idle keep-alive connection holds a
thread blocked in `recv` (little memory); every socket and disk wait releases the GIL.

HTTP/1.1 parsing is httptools (llhttp, the parser of Node.js and uvicorn). Supported: keep-alive, pipelining, chunked
request bodies, `Expect: 100-continue`, streamed answers (chunked, or close-delimited for HTTP/1.0), HEAD. Limits
answer with their own status: 400 malformed, 408 too slow, 413 body too large, 431 headers too large, 503 too many
connections. Bodies are read whole before the app runs (what every reef_lab route wants). While an answer streams,
the connection is watched for the client closing it: the app can hand `environ["reef.on_hangup"]` a callback (the
gateway cancels the generation), since a stream that writes nothing for a while (a long prompt's prefill) would
otherwise notice only at its next write.

Processes: `run()` binds the socket, starts the workers (`python -m server.httpd <spec>`, the socket passed as an
inherited fd), restarts one that dies after it was ready, stops all on SIGINT/SIGTERM (each finishes the requests
it has started) and fails fast when one cannot start. Workers start through reef_lab.procs, so a worker and
whatever it starts (a vLLM server) die with this process, `kill -9` included. An app module may define `stopping()`:
a stopping worker calls it once it takes no new requests and before it waits for those in progress (server/wsgi.py
ends the embedded engine's generations there, so a worker exits in seconds, not after the longest generation).
"""

from __future__ import annotations

import atexit
import collections
import io
import logging
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass
from email.utils import formatdate
from functools import partial
from pathlib import Path

import httptools
import orjson

from reef_lab.procs import Popen

log = logging.getLogger("reef_lab.server")

ROOT = Path(__file__).resolve().parents[1]
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_NO_BODY = {204, 304}


@dataclass
class ConnectionLimits:
    """What one connection may send and how long it may take (sizes in bytes, times in seconds)."""

    header_bytes: int = 64 * 1024  # request line and headers
    body_bytes: int = 512 * 1024 * 1024  # a whole request body (record imports can be large)
    header_timeout: float = 30.0  # from a request's first byte to the end of its headers
    read_timeout: float = 60.0  # longest a body may take after its headers, or a send may take to drain
    keepalive_timeout: float = 75.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1024  # open connections per worker; more are answered 503
    max_requests: int = 32  # requests in progress at once per worker (a stream holds one until it ends)
    grace: float = 30.0  # on stop, how long requests in progress may take to finish


class HTTPError(Exception):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason = status, reason


class _Request:
    __slots__ = ("method", "url", "version", "headers", "body", "keep_alive", "has_length")

    def __init__(self, method, url, version, headers, body, keep_alive, has_length):
        self.method, self.url, self.version, self.headers = method, url, version, headers
        self.body, self.keep_alive, self.has_length = body, keep_alive, has_length


class _Reader:
    """httptools' callbacks for one connection: complete requests queue up in `done`, in order."""

    def __init__(self, limits: ConnectionLimits, send_continue):
        self.limits, self.send_continue = limits, send_continue
        self.parser = httptools.HttpRequestParser(self)
        self.done: collections.deque[_Request] = collections.deque()
        self.in_message = self.headers_done = False
        self.head_bytes = 0  # bytes fed since the last message's headers ended (bounds a never-ending header)
        self.started = self.headers_at = 0.0
        self._reset()

    def _reset(self) -> None:
        self.url, self.headers, self.body, self.size, self.has_length = b"", [], [], 0, False

    def on_message_begin(self) -> None:
        self.in_message, self.started = True, time.monotonic()
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.headers_done, self.head_bytes, self.headers_at = True, 0, time.monotonic()
        if len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers) > self.limits.header_bytes:
            raise HTTPError(431, "Request Header Fields Too Large",
                            f"the request line and headers are larger than {self.limits.header_bytes} bytes")
        p = self.parser
        self.method, self.version, self.keep = p.get_method().decode("latin-1"), p.get_http_version(), \
            p.should_keep_alive()
        expect = False
        for name, value in self.headers:
            n = name.lower()
            if n == b"content-length":
                self.has_length = True
                if value.strip().isdigit() and int(value) > self.limits.body_bytes:
                    raise HTTPError(413, "Content Too Large", f"the request body ({int(value)} bytes) is larger "
                                    f"than this server takes ({self.limits.body_bytes} bytes)")
            elif n == b"transfer-encoding":
                self.has_length = True
            elif n == b"expect" and value.strip().lower() == b"100-continue":
                expect = True
        if expect and self.version == "1.1":
            self.send_continue()

    def on_body(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limits.body_bytes:
            raise HTTPError(413, "Content Too Large", f"the request body is larger than this server takes "
                            f"({self.limits.body_bytes} bytes)")
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        self.done.append(_Request(self.method, self.url, self.version, self.headers, b"".join(self.body),
                                  self.keep, self.has_length))
        self.in_message = self.headers_done = False
        self._reset()


def _linger(conn: socket.socket, seconds: float = 1.0, most: int = 1 << 20) -> None:
    """Close after an error answer the way clients can read it: stop sending, then drain what the client is still
    sending (a body we refused) for a moment; closing with input unread would reset the connection and could
    destroy the answer before the client reads it."""
    try:
        conn.shutdown(socket.SHUT_WR)
        deadline, n = time.monotonic() + seconds, 0
        while n < most and (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(65536)
            if not chunk:
                return
            n += len(chunk)
    except OSError:
        pass


_date_cache = [0, ""]


def _http_date() -> str:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[:] = [now, formatdate(now, usegmt=True)]
    return _date_cache[1]


def _plain(status: int, reason: str, message: str) -> bytes:
    """An answer the server itself gives (the app never saw the request), in the error shape the app's own
    answers have, so a client parses it the same way."""
    kind = {408: "request_timeout", 413: "request_too_large", 503: "overloaded_error"}.get(status,
                                                                                        "invalid_request_error")
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            f"\r\nConnection: close\r\nDate: {_http_date()}\r\n\r\n").encode() + body


class _Hangups:
    """Watches the connections of streaming answers and calls the app's callback when a client closes one.

    One thread per server polls the watched sockets (every `interval` s, to take new ones); end of input or a reset
    means the client is gone. Input that is data instead (a pipelined next request) ends the watch: that client is
    still there. A client that only half-closes (shuts its sending side, keeps reading) reads as gone too.
    """

    _GONE = select.POLLHUP | select.POLLERR | select.POLLRDHUP

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self._watched: dict[socket.socket, object] = {}
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, conn: socket.socket, callback) -> None:
        with self._cv:
            if self._closed:
                return
            self._watched[conn] = callback
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="http-hangups")
                self._thread.start()
            self._cv.notify()

    def forget(self, conn: socket.socket) -> None:
        if self._watched:
            with self._cv:
                self._watched.pop(conn, None)

    def close(self) -> None:
        """Stop watching (a stopping server shuts its connections' input itself)."""
        with self._cv:
            self._closed = True
            self._watched.clear()
            self._cv.notify()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._watched and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                watched = list(self._watched)
            poller, by_fd = select.poll(), {}
            for conn in watched:
                fd = conn.fileno()
                if fd >= 0:
                    by_fd[fd] = conn
                    poller.register(fd, select.POLLIN | select.POLLRDHUP)
            for fd, events in poller.poll(self.interval * 1000):
                conn = by_fd[fd]
                gone = self._gone(conn, events)
                with self._cv:
                    callback = self._watched.pop(conn, None)
                if gone and callback is not None:
                    try:
                        callback()
                    except Exception:
                        log.exception("the hang-up callback of a streaming answer failed")

    def _gone(self, conn: socket.socket, events: int) -> bool:
        if events & self._GONE:
            return True
        try:
            return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True


class Server:
    """Serve a WSGI `app` on a bound, listening socket `sock` until `stop()` (or a signal handler raising in the
    thread that runs `serve_forever`)."""

    def __init__(self, app, sock: socket.socket, limits: ConnectionLimits | None = None, multiprocess: bool = False):
        self.app, self.sock, self.limits, self.multiprocess = app, sock, limits or ConnectionLimits(), multiprocess
        addr = sock.getsockname()
        self.server_name, self.server_port = str(addr[0]), str(addr[1])
        self.stopping = False
        self._slots = threading.BoundedSemaphore(self.limits.max_requests)
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._lock = threading.Lock()
        self._hangups = _Hangups()

    # ---- accepting ---------------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        self.sock.settimeout(0.5)  # to notice stop() from another thread
        while not self.stopping:
            try:
                conn, addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as e:
                if self.stopping:
                    return
                log.warning("accept failed (%s); retrying", e)  # e.g. out of file descriptors
                time.sleep(0.05)
                continue
            with self._lock:
                full = len(self._conns) >= self.limits.max_connections
                if not full:
                    t = threading.Thread(target=self._connection, args=(conn, addr), daemon=True,
                                         name=f"http-{addr[1] if len(addr) > 1 else 0}")
                    self._conns[conn] = t
            if full:
                try:
                    conn.sendall(_plain(503, "Service Unavailable", f"this worker holds its maximum of "
                                        f"{self.limits.max_connections} connections; retry shortly"))
                    conn.shutdown(socket.SHUT_WR)
                    conn.setblocking(False)
                    conn.recv(65536)  # what already arrived: closing with it unread would reset the connection
                except OSError:
                    pass
                conn.close()
                continue
            t.start()

    def stop(self, grace: float | None = None, on_stop=None) -> None:
        """Stop taking connections; requests in progress finish (up to `grace` s), idle connections close.
        `on_stop()`, when given, runs once no new request is taken, before the wait."""
        self.stopping = True
        self._hangups.close()  # shutting the input below would read as every streaming client gone
        with self._lock:
            conns = list(self._conns.items())
        for conn, _ in conns:
            try:
                conn.shutdown(socket.SHUT_RD)  # wakes a thread waiting for the next request; answers still go out
            except OSError:
                pass
        if on_stop is not None:
            on_stop()
        deadline = time.monotonic() + (self.limits.grace if grace is None else grace)
        for _, t in conns:
            t.join(max(0.0, deadline - time.monotonic()))

    # ---- one connection ----------------------------------------------------------------------------------------
    def _connection(self, conn: socket.socket, addr) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        try:
            if self._read_loop(conn, addr):
                _linger(conn)
        except OSError:
            pass  # the client went away
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def _read_loop(self, conn: socket.socket, addr) -> bool:
        """Serve the connection's requests; True when it ends on an error answer (unread input may follow)."""
        lim = self.limits
        reader = _Reader(lim, lambda: conn.sendall(_CONTINUE))
        while True:
            while reader.done:
                if not self._respond(conn, addr, reader.done.popleft()):
                    return False
            if self.stopping and not reader.in_message:
                return False
            if not reader.in_message:
                wait = lim.keepalive_timeout
            elif not reader.headers_done:
                wait = lim.header_timeout - (time.monotonic() - reader.started)
            else:  # the whole body within read_timeout of the headers' end: a trickle cannot hold the thread
                wait = lim.read_timeout - (time.monotonic() - reader.headers_at)
            if wait <= 0:
                what = "body" if reader.headers_done else "headers"
                limit = lim.read_timeout if reader.headers_done else lim.header_timeout
                conn.sendall(_plain(408, "Request Timeout", f"the request's {what} took longer than {limit:g} s "
                                    "to arrive"))
                return True
            conn.settimeout(wait)
            try:
                data = conn.recv(65536)
            except TimeoutError:
                if reader.in_message:
                    conn.sendall(_plain(408, "Request Timeout", f"no bytes of the request for {wait:.0f} s"))
                    return True
                return False
            if not data:
                return False
            if not reader.headers_done:
                reader.head_bytes += len(data)
            error = None
            try:
                reader.parser.feed_data(data)
            except httptools.HttpParserUpgrade:  # answered as a plain request (RFC 9110 7.8 lets a server ignore
                if reader.done:  # Upgrade); what follows would be another protocol, so the connection then closes
                    reader.done[-1].keep_alive = False
                    continue
                error = HTTPError(400, "Bad Request", "a connection upgrade with a body is not supported")
            except httptools.HttpParserCallbackError as e:
                error = e.__context__ if isinstance(e.__context__, HTTPError) else \
                    HTTPError(400, "Bad Request", f"malformed HTTP request: {e.__context__ or e}")
            except httptools.HttpParserError as e:
                error = HTTPError(400, "Bad Request", f"malformed HTTP request: {e}")
            if error is None and not reader.headers_done and reader.head_bytes > lim.header_bytes:
                error = HTTPError(431, "Request Header Fields Too Large",
                                  f"the request line and headers are larger than {lim.header_bytes} bytes")
            if error is not None:
                while reader.done:  # requests before the bad one (pipelined) are answered first
                    if not self._respond(conn, addr, reader.done.popleft()):
                        return False
                conn.sendall(_plain(error.status, error.reason, str(error)))
                return True

    def _environ(self, req: _Request, addr) -> dict:
        url = httptools.parse_url(req.url)
        env = {
            "REQUEST_METHOD": req.method, "SCRIPT_NAME": "",
            "PATH_INFO": urllib.parse.unquote_to_bytes(url.path or b"/").decode("latin-1"),
            "QUERY_STRING": (url.query or b"").decode("latin-1"),
            "SERVER_NAME": self.server_name, "SERVER_PORT": self.server_port,
            "SERVER_PROTOCOL": f"HTTP/{req.version}",
            "REMOTE_ADDR": str(addr[0]) if addr else "", "REMOTE_PORT": str(addr[1]) if len(addr) > 1 else "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(req.body),
            "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": self.multiprocess,
            "wsgi.run_once": False, "wsgi.input_terminated": True,
        }
        if req.has_length or req.body:
            env["CONTENT_LENGTH"] = str(len(req.body))  # the body is read whole (chunked ones too)
        for name, value in req.headers:
            key = name.decode("latin-1").upper()
            if "_" in key:  # x_reef_scenario would collide with x-reef-scenario in the environ: dropped
                continue
            key = key.replace("-", "_")
            v = value.decode("latin-1")
            if key == "CONTENT_TYPE":
                env[key] = v
            elif key not in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
                key = "HTTP_" + key
                env[key] = f"{env[key]},{v}" if key in env else v
        return env

    def _respond(self, conn: socket.socket, addr, req: _Request) -> bool:
        """Run the app for one request and send its answer; False when the connection must close."""
        try:
            env = self._environ(req, addr)
        except httptools.HttpParserInvalidURLError:
            conn.sendall(_plain(400, "Bad Request", f"malformed request target {req.url[:200]!r}"))
            return False
        conn.settimeout(self.limits.read_timeout)
        env["reef.on_hangup"] = partial(self._hangups.watch, conn)
        with self._slots:
            try:
                return _Exchange(self, conn, req).run(env)
            finally:
                self._hangups.forget(conn)


class _Exchange:
    """One request's answer: the WSGI start_response/iterate protocol onto the socket."""

    __slots__ = ("conn", "req", "keep", "status", "headers", "sent", "chunked", "app", "stopping")

    def __init__(self, server: Server, conn: socket.socket, req: _Request):
        self.conn, self.req, self.app = conn, req, server.app
        self.keep = req.keep_alive and not server.stopping
        self.status = self.headers = None
        self.sent = self.chunked = False

    def start_response(self, status: str, headers: list, exc_info=None):
        if exc_info is not None:
            try:
                if self.sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response was called twice without exc_info")
        self.status, self.headers = status, headers
        return self._write

    def _head(self, length: int | None) -> bytes:
        """The status line and headers; `length` is the whole body's size when known before sending."""
        if self.status is None:
            raise AssertionError("the app sent a body before calling start_response")
        code = int(self.status[:3])
        no_body = self.req.method == "HEAD" or code in _NO_BODY or code < 200
        lines = [f"HTTP/1.1 {self.status}\r\n"]
        framed = has_date = False
        for k, v in self.headers:
            lk = k.lower()
            if lk in ("content-length", "transfer-encoding"):
                framed = True
            elif lk == "connection":
                if "close" in v.lower():
                    self.keep = False
                continue
            elif lk == "date":
                has_date = True
            lines.append(f"{k}: {v}\r\n")
        if not framed and not no_body:
            if length is not None:
                lines.append(f"Content-Length: {length}\r\n")
            elif self.req.version == "1.1":
                lines.append("Transfer-Encoding: chunked\r\n")
                self.chunked = True
            else:
                self.keep = False  # HTTP/1.0 and no length: the body ends when the connection does
        if not has_date:
            lines.append(f"Date: {_http_date()}\r\n")
        if not self.keep:
            lines.append("Connection: close\r\n")
        elif self.req.version == "1.0":
            lines.append("Connection: keep-alive\r\n")
        lines.append("\r\n")
        self.sent = True
        return "".join(lines).encode("latin-1")

    def _frame(self, data: bytes) -> bytes:
        if not data or self.req.method == "HEAD":
            return b""
        return b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data

    def _write(self, data: bytes) -> None:  # the legacy write() callable of PEP 3333
        if data:
            self.conn.sendall((b"" if self.sent else self._head(None)) + self._frame(data))

    def _end(self) -> bytes:
        return b"0\r\n\r\n" if self.chunked and self.req.method != "HEAD" else b""

    def run(self, env: dict) -> bool:
        try:
            rv = self.app(env, self.start_response)
        except Exception:
            log.exception("unhandled error in the app on %s %s", self.req.method, env.get("PATH_INFO"))
            if not self.sent:
                self.conn.sendall(_plain(500, "Internal Server Error", "internal server error (see the server log)"))
            return False
        try:
            if type(rv) is list:  # the common case: head and body in one send
                body = b"".join(rv)
                if not self.sent:
                    self.conn.sendall(self._head(len(body)) + self._frame(body))
                else:  # the app used write() before returning
                    self.conn.sendall(self._frame(body) + self._end())
                return self.keep
            for part in rv:
                if part:
                    self.conn.sendall((b"" if self.sent else self._head(None)) + self._frame(part))
            self.conn.sendall(self._end() if self.sent else self._head(0))
            return self.keep
        except OSError:
            return False  # the client went away (mid-stream included): closing the iterable below ends the work
        except Exception:
            log.exception("unhandled error in the app's answer to %s %s", self.req.method, env.get("PATH_INFO"))
            if not self.sent:
                self.conn.sendall(_plain(500, "Internal Server Error", "internal server error (see the server log)"))
            return False
        finally:
            close = getattr(rv, "close", None)
            if close is not None:
                close()


# ---- processes -------------------------------------------------------------------------------------------------
def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The listening socket, or SystemExit with what to do when the address is taken or wrong."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as e:
        raise SystemExit(f"cannot listen on {host}:{port}: {e.strerror or e}; "
                         "choose another --port (or --host), or stop what holds it") from None


class _Stop(BaseException):
    pass


def _raise_stop(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Stop()


def worker_main(spec: dict) -> None:
    """A worker process: import the app (it builds itself), tell the parent, serve until SIGINT/SIGTERM."""
    sock = socket.socket(fileno=spec["fd"])
    ready = spec.get("ready_fd")
    module, _, attr = spec["app"].partition(":")
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    try:
        mod = __import__(module, fromlist=[attr])
    except _Stop:
        return
    serving = False
    try:  # a stop signal may come at any moment, also between the app's import and serving (a restart of all)
        server = Server(getattr(mod, attr), sock, ConnectionLimits(**spec.get("limits", {})),
                        multiprocess=spec.get("workers", 1) > 1)
        if ready is not None:  # P: the app's primary (its module says role = "primary"), see run()
            os.write(ready, b"P" if getattr(mod, "role", None) == "primary" else b"1")
            os.close(ready)
        serving = True
        server.serve_forever()
    except _Stop:
        if not serving:  # no request was taken: the app's exit handlers close what it built
            sock.close()
            exit_now()
    stopped = time.monotonic()
    server.stop(on_stop=getattr(mod, "stopping", None))
    sock.close()
    log.info("worker %d: requests in progress ended %.1f s after the stop signal", os.getpid(),
             time.monotonic() - stopped)
    exit_now()


def exit_now(code: int = 0) -> None:
    """Run the exit handlers (the app's close: records made durable, learners stopped, logs flushed), then end the
    process without the interpreter's teardown, which frees a loaded model's objects one by one: seconds of CPU,
    far more on a busy machine, between a stop signal and the exit. Threads still running end with the process."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def run(app: str, host: str, port: int, workers: int = 1, limits: ConnectionLimits | None = None) -> int:
    """Serve `app` ("module:attribute", built on import in each worker) from `workers` processes; returns the exit
    code once stopped (SIGINT/SIGTERM: 0; a worker that could not start: 1)."""
    limits = limits or ConnectionLimits()
    sock = listen(host, port)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    sel = selectors.DefaultSelector()
    procs: dict[int, Popen] = {}
    ready: dict[int, bytes] = {}  # b"" until the worker is up, then b"1" (or b"P" for the app's primary)
    crashes: collections.deque[float] = collections.deque(maxlen=5)

    def spawn(k: int) -> None:
        r, w = os.pipe()
        spec = {"app": app, "fd": sock.fileno(), "ready_fd": w, "workers": workers, "limits": asdict(limits)}
        # reef_lab.procs: a worker and what it starts (a vLLM server) die with this process, kill -9 included; in
        # this process group, so a supervisor's signal to the group reaches the workers at once, as it always has
        procs[k] = Popen([sys.executable, "-m", "server.httpd", orjson.dumps(spec).decode()],
                         pass_fds=(sock.fileno(), w), cwd=ROOT, new_session=False)
        os.close(w)
        ready[k] = b""
        sel.register(r, selectors.EVENT_READ, (k, procs[k]))

    def stop_all() -> None:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + limits.grace + 10
        for p in procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop within %.0f s; killing it", p.child_pid, limits.grace + 10)
                p.kill()
                p.wait()

    for k in range(workers):
        spawn(k)
    code = 0
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.2):
            k, p = key.data
            byte = os.read(key.fd, 1)
            if procs[k] is p:  # not a worker already replaced
                ready[k] = byte
            sel.unregister(key.fd)
            os.close(key.fd)
        for k, p in list(procs.items()):
            rc = p.poll()
            if rc is None or stop.is_set():
                continue
            if not ready[k]:
                log.error("worker %d exited with code %s before it was ready; stopping (its log is above)",
                          p.child_pid, rc)
                code = 1
                stop.set()
                break
            crashes.append(time.monotonic())
            if len(crashes) == crashes.maxlen and crashes[-1] - crashes[0] < 60:
                log.error("workers exited %d times within a minute; stopping", crashes.maxlen)
                code = 1
                stop.set()
                break
            if ready[k] == b"P" and workers > 1:
                # The primary keeps the state the others lean on (server/workers.py); a new one recovers the record
                # logs on start, which it may do only once no other worker writes them: so all start afresh.
                log.warning("the primary worker %d exited with code %s; restarting all workers", p.child_pid, rc)
                stop_all()
                for j in range(workers):
                    spawn(j)
                break
            log.warning("worker %d exited with code %s; starting another", p.child_pid, rc)
            spawn(k)
    stop_all()
    sock.close()
    return code


if __name__ == "__main__":
    worker_main(orjson.loads(sys.argv[1]))
