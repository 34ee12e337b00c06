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


def test_bring_your_own_key_says_the_servers_own_provider_calls_have_none(tmp_path, stub_url):
    """--upstream-key-from-client with no operator key: clients' requests carry their keys, but GEPA's own calls (the
    deployment's model as task and reflection LM) would carry none and fail against a real provider. The scenario
    says so (409 on train, its error in /reef/scenarios/{s}); with an operator key it learns as before."""
    import requests

    from reef_lab.gateway.gateway import Gateway
    from tests.conftest import Running

    for key, learns in (("", False), ("operator-key", True)):
        engine = UpstreamEngine(stub_url, model="stub-model", api_key=key, key_from_client=True)
        s = Running(Gateway(tmp_path / f"data-{learns}", engine, default_recipe="gepa",
                            default_config={"mode": "manual"}))
        try:
            assert requests.post(s.url + "/reef/scenarios", json={"name": "h"}, timeout=30).status_code == 201
            r = requests.post(s.url + "/reef/train", json={"scenario": "h"}, timeout=60)
            if learns:
                assert r.status_code != 500 and "holds no provider key" not in r.text, r.text
            else:
                assert r.status_code == 409 and "holds no provider key" in r.json()["error"]["message"], r.text
                error = requests.get(s.url + "/reef/scenarios/h", timeout=30).json()["error"]
                assert "set REEF_UPSTREAM_API_KEY" in error, error
        finally:
            s.stop()
