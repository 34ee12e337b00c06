"""The upstream pool against a provider that closes idle keep-alive connections (as servers do on a timeout)."""

import socket
import threading

from reef_lab.engines.upstream import UpstreamEngine

ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
          b'{"ok":true}')


def one_answer_per_connection_server(together: int):
    """Answers one request per connection, then closes it without saying so (no Connection: close).
    The first `together` connections are all accepted before any is answered, so each client has its own."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted = []

    def serve():
        first = [srv.accept()[0] for _ in range(together)]
        for conn in first:
            answer(conn)
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            answer(conn)

    def answer(conn):
        accepted.append(conn)
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(4096)
        head, _, rest = data.partition(b"\r\n\r\n")
        length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0]
                     .split(b":")[1])
        while len(rest) < length:
            rest += conn.recv(4096)
        conn.sendall(ANSWER)
        conn.close()
    threading.Thread(target=serve, daemon=True).start()
    return srv, accepted


def test_stale_pooled_connections_are_retried_on_a_new_one():
    srv, accepted = one_answer_per_connection_server(together=4)
    eng = UpstreamEngine(f"http://127.0.0.1:{srv.getsockname()[1]}", timeout=5)
    body = {"model": "m", "messages": []}
    # Four calls at once leave four pooled connections, all of which the provider has closed since.
    ts = [threading.Thread(target=eng.forward, args=("/v1/chat/completions", body, {})) for _ in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(eng.pool._idle) == 4
    for _ in range(3):
        r = eng.forward("/v1/chat/completions", body, {})
        assert r.status == 200 and r.body == b'{"ok":true}'
    assert len(accepted) == 7  # every call ended on a fresh connection, none failed
    srv.close()
