"""The vLLM engine's streamed completion read against a loopback double of vLLM's /v1/completions wire format
(OpenAI completions SSE with vLLM's `token_ids` and `return_tokens_as_token_ids` logprobs): text deltas in order,
token ids and logprobs joined, the finish and stop reasons, a weights lease given back exactly once whatever the
end, and a connection the server drops mid-answer as EngineUnavailable. (SGLang's stream is driven end to end by
tests/test_sglang_engine.py against reef_lab/testing/sglang_server.py; both share remote.ServerStream.)"""

from __future__ import annotations

import http.server
import json
import threading
from types import SimpleNamespace

import pytest

from reef_lab.engines.remote import EngineClient, EngineError
from reef_lab.engines.vllm import VLLMStream
from reef_lab.errors import EngineUnavailable


class Completions(http.server.ThreadingHTTPServer):
    """Streams `chunks` as `data:` events in HTTP/1.1 chunked transfer encoding (as vLLM's server does), then
    `[DONE]` unless `drop`: the connection is then cut in the middle of a chunk."""

    def __init__(self, chunks: list[dict], drop: bool = False):
        self.chunks, self.drop, self.bodies = chunks, drop, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def send(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for c in outer.chunks:
                    self.send(b"data: " + json.dumps(c).encode() + b"\n\n")
                if outer.drop:  # a chunk announced and never finished: the server died mid-answer
                    self.wfile.write(b"400\r\ndata: {")
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    self.close_connection = True
                    return
                self.send(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def chunk(text: str, ids: list[int], logprobs: list[float | None], finish: str | None = None, stop=None) -> dict:
    return {"choices": [{"text": text, "token_ids": ids, "logprobs": {"token_logprobs": logprobs},
                         "finish_reason": finish, "stop_reason": stop}]}


def engine(url: str) -> SimpleNamespace:
    gate = SimpleNamespace(released=0)
    gate.release = lambda: setattr(gate, "released", gate.released + 1)
    return SimpleNamespace(client=EngineClient(url, timeout=60), gate=gate)


def test_a_completion_streams_its_deltas_and_joins_ids_and_logprobs():
    server = Completions([chunk("Hel", [1, 2], [-0.5, None]), chunk("lo", [3], [-1.25]),
                          chunk("", [], [], finish="stop", stop="\n\n")])
    try:
        eng = engine(server.url)
        stream = VLLMStream(eng, {"prompt": [7, 8], "stream": True}, [7, 8], "v1", lease=True)
        assert list(stream) == ["Hel", "lo"]
        g = stream.result(60)
        assert (g.text, g.token_ids, g.logprobs, g.finish_reason, g.stop_sequence, g.release_id,
                g.prompt_token_ids) == ("Hello", [1, 2, 3], [-0.5, 0.0, -1.25], "stop", "\n\n", "v1", [7, 8])
        assert eng.gate.released == 1 and server.bodies == [{"prompt": [7, 8], "stream": True}]
    finally:
        server.shutdown()


@pytest.mark.parametrize("chunks, drop, error, says", [
    ([chunk("a", [1], [-0.1])], True, EngineUnavailable, "failed during the answer"),
    ([{"error": {"message": "the prompt is too long"}}], False, EngineError, "the prompt is too long"),
    ([chunk("a", [1], [-0.1])], False, EngineError, "without finishing"),
    ([chunk("a", [1, 2], [-0.1], finish="length")], False, EngineError, "2 tokens but 1 logprobs"),
    ([chunk("", [], [], finish="abort")], False, EngineError, "aborted"),
])
def test_a_completion_that_fails_says_why_and_gives_its_lease_back(chunks, drop, error, says):
    server = Completions(chunks, drop)
    try:
        eng = engine(server.url)
        stream = VLLMStream(eng, {"prompt": [1]}, [1], "base", lease=True)
        with pytest.raises(error, match=says):
            stream.result(60)
        with pytest.raises(error):
            list(stream)
        assert eng.gate.released == 1
    finally:
        server.shutdown()
