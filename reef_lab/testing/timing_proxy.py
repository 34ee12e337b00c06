"""A loopback TCP proxy that times every HTTP/1.1 exchange passing through it, as the client sees it.

Put it between an agent and its base URL: for each request it records the path, when the request's first byte
arrived, when the answer's first byte came back and when its last did (the response parsed by httptools, so a
streamed answer ends at its last chunk). Put in front of the provider directly and in front of reef_lab, the same
proxy times both routes the same way; the difference is what the relay adds per call. TCP_NODELAY on both sides.
"""

from __future__ import annotations

import collections
import socket
import threading
import time

import httptools


class _Requests:
    def __init__(self, conn: _Connection):
        self.conn, self.url = conn, b""

    def on_message_begin(self):
        self.url = b""
        self.conn.pending.append({"start": time.perf_counter()})

    def on_url(self, url: bytes):
        self.url += url

    def on_headers_complete(self):
        self.conn.pending[-1]["path"] = self.url.decode(errors="replace").split("?")[0]


class _Responses:
    def __init__(self, conn: _Connection):
        self.conn = conn

    def on_message_complete(self):
        if self.conn.pending:
            ex = self.conn.pending.popleft()
            ex["end"] = time.perf_counter()
            ex.setdefault("first_byte", ex["end"])
            with self.conn.proxy.lock:
                self.conn.proxy.exchanges.append(ex)


class _Connection:
    def __init__(self, proxy: TimingProxy, client: socket.socket):
        self.proxy, self.client = proxy, client
        self.pending: collections.deque = collections.deque()
        self.server = socket.create_connection(("127.0.0.1", proxy.target_port))
        for s in (client, self.server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.req_parser = httptools.HttpRequestParser(_Requests(self))
        self.resp_parser = httptools.HttpResponseParser(_Responses(self))
        self.threads = [threading.Thread(target=self._pump, args=(client, self.server, True), daemon=True),
                        threading.Thread(target=self._pump, args=(self.server, client, False), daemon=True)]
        for t in self.threads:
            t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        try:
            while data := src.recv(65536):
                if upstream:
                    self.req_parser.feed_data(data)
                else:
                    now = time.perf_counter()
                    for ex in self.pending:
                        ex.setdefault("first_byte", now)
                        ex["last_byte"] = now
                        break
                    self.resp_parser.feed_data(data)
                dst.sendall(data)
        except (OSError, httptools.HttpParserError):
            pass
        finally:
            if not upstream:
                self._closed()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


    def _closed(self) -> None:
        """A client may hang up once it has read a stream's last event, before the closing chunk arrives: an
        exchange that got bytes ends at its last one."""
        while self.pending:
            ex = self.pending.popleft()
            if "last_byte" in ex:
                ex["end"] = ex["last_byte"]
                with self.proxy.lock:
                    self.proxy.exchanges.append(ex)


class TimingProxy:
    """`with TimingProxy(target_port) as p:` listens on p.url; after the block, `p.times_ms()` gives every exchange."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.exchanges: list[dict] = []
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._open: list[_Connection] = []

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self._open.append(_Connection(self, client))

    def __enter__(self) -> TimingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop, and wait for every connection's last bytes to be counted (read the times after this)."""
        self.sock.close()
        for c in self._open:
            for s in (c.client, c.server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for c in self._open:
            for t in c.threads:
                t.join(timeout=10)
            c.client.close()
            c.server.close()

    def times_ms(self) -> list[dict]:
        """Each exchange: path, total (request's first byte to answer's last) and first byte, in ms."""
        with self.lock:
            return [{"path": e.get("path"), "total_ms": (e["end"] - e["start"]) * 1e3,
                     "first_byte_ms": (e["first_byte"] - e["start"]) * 1e3} for e in self.exchanges]
