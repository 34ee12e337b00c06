"""A stub model provider on loopback, speaking the OpenAI and Anthropic wire formats as documented.

It answers `echo: <last user text>` so tests can check what reached it (`!system` instead answers with the
system text it received: OpenAI system messages, `instructions`, or Anthropic `system`), and misbehaves on
request: a last user message containing `!500`, `!400`, `!429`, `!notjson` or `!sleep=<s>` gets an HTTP 500,
an HTTP 400, a rate limit (429 with retry-after), a 200 whose body is not JSON, or a late answer. For harness-learning tests it is also a predictable task and reflection model: asked to write a new
version of an instruction file ("Write a new version of" in the last user text) it answers with an instruction
that holds the marker REEF-SOLVE; a "Calculate <expression>." question under a system text holding REEF-SOLVE gets
the right number, and otherwise the echo (which is wrong). It is a plain WSGI app (no framework) so benchmarks
measure the gateway, not the stub. Run it alone with
`python -m reef_lab.testing.stub_provider --port 9000` (served by granian).
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time

import orjson

_SLEEP = re.compile(rb"!sleep=([0-9.]+)")
DELAY_S = float(os.environ.get("REEF_STUB_DELAY_MS", "0")) / 1000  # every answer's delay, like a provider's compute


def _last_user_text(body: dict) -> str:
    msgs = body.get("messages")
    if msgs is None:
        inp = body.get("input")
        return inp if isinstance(inp, str) else str(inp[-1].get("content")) if inp else ""
    for m in reversed(msgs):
        if m.get("role") == "user":
            c = m.get("content") or ""
            return c if isinstance(c, str) else "".join(str(p.get("text", "")) for p in c)
    return ""


def _malformed(path: str, body) -> str | None:
    """Why a body is not a request of this route's shape (None when it is), checked as far as the stub reads it."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    key = "input" if path == "/v1/responses" else "messages"
    msgs = body.get(key)
    if path == "/v1/responses" and isinstance(msgs, str):
        msgs = []
    if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
        return f"'{key}' must be a list of message objects"
    for m in msgs:
        c = m.get("content")
        if not isinstance(c, (str, list, type(None))) or isinstance(c, list) and not all(isinstance(p, dict)
                                                                                       for p in c):
            return "a message's 'content' must be a string or a list of content blocks"
    system = body.get("system", body.get("instructions"))
    if system is not None and not isinstance(system, (str, list)) or isinstance(system, list) and not all(
            isinstance(b, dict) for b in system):
        return "'system' must be a string or a list of text blocks"
    return None


def _system_text(body: dict) -> str:
    if isinstance(body.get("instructions"), str):
        return body["instructions"]
    system = body.get("system")
    if system is not None:
        return system if isinstance(system, str) else "\n".join(str(b.get("text", "")) for b in system)
    return "\n".join(m["content"] for m in body.get("messages") or []
                     if m.get("role") == "system" and isinstance(m.get("content"), str))


_EXPR = re.compile(r"^Calculate ([-+*/() 0-9.]+)\.$")
IMPROVED_INSTRUCTION = "REEF-SOLVE: compute the expression and reply with the final number only."


def _answer(body: dict, last: str) -> str:
    if last == "!system":
        return "system: " + _system_text(body)
    if "Write a new version of" in last:
        return IMPROVED_INSTRUCTION
    m = _EXPR.match(last.strip())
    if m and "REEF-SOLVE" in _system_text(body):
        value = eval(m.group(1), {"__builtins__": {}})  # noqa: S307 - digits, operators and parentheses only
        return str(int(value) if float(value).is_integer() else value)
    return "echo: " + last


def _sse(obj, event=None) -> bytes:
    return (f"event: {event}\n".encode() if event else b"") + b"data: " + orjson.dumps(obj) + b"\n\n"


def _chat(body, text):
    if not body.get("stream"):
        return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 1, "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    base = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1, "model": body.get("model")}
    out = [_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    for w in text.split(" "):
        out.append(_sse({**base, "choices": [{"index": 0, "delta": {"content": w + " "}}]}))
    out.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    return out + [b"data: [DONE]\n\n"]


def _messages(body, text):
    msg = {"id": "msg_stub", "type": "message", "role": "assistant", "model": body.get("model"),
           "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
           "usage": {"input_tokens": 5, "output_tokens": 3}}
    if not body.get("stream"):
        return msg
    out = [_sse({"type": "message_start", "message": {**msg, "content": [], "stop_reason": None}}, "message_start"),
           _sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                "content_block_start")]
    for w in text.split(" "):
        out.append(_sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta",
                                                                              "text": w + " "}},
                        "content_block_delta"))
    out += [_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            _sse({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                  "usage": {"output_tokens": 3}}, "message_delta"),
            _sse({"type": "message_stop"}, "message_stop")]
    return out


def _responses(body, text):
    item = {"type": "message", "id": "msg_stub", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    resp = {"id": "resp_stub", "object": "response", "created_at": 1, "model": body.get("model"),
            "status": "completed", "output": [item], "error": None, "incomplete_details": None,
            "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}
    if not body.get("stream"):
        return resp
    seq = iter(range(1000))
    pending = {**resp, "status": "in_progress", "output": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    ids = {"item_id": "msg_stub", "output_index": 0, "content_index": 0}
    events = [("response.created", {"response": pending}),
              ("response.output_item.added", {"output_index": 0, "item": {**item, "status": "in_progress",
                                                                          "content": []}}),
              ("response.content_part.added", {**ids, "part": part}),
              ("response.output_text.delta", {**ids, "delta": text, "logprobs": []}),
              ("response.output_text.done", {**ids, "text": text, "logprobs": []}),
              ("response.content_part.done", {**ids, "part": {**part, "text": text}}),
              ("response.output_item.done", {"output_index": 0, "item": item}),
              ("response.completed", {"response": resp})]
    return [_sse({"type": k, "sequence_number": next(seq), **v}, k) for k, v in events]


ROUTES = {"/v1/chat/completions": _chat, "/v1/messages": _messages, "/v1/responses": _responses}


def app(environ, start_response):
    path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD")
    if method == "GET" and path == "/v1/models":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"object":"list","data":[{"id":"stub-model","object":"model","created":1,"owned_by":"stub"}]}']
    if path == "/v1/messages/count_tokens":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b'{"input_tokens":5}']
    handler = ROUTES.get(path)
    if handler is None or method != "POST":
        start_response("404 Not Found", [("Content-Type", "application/json")])
        return [b'{"error":{"message":"no such route","type":"not_found"}}']
    raw = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0) or -1)
    try:
        body = orjson.loads(raw)
        problem = _malformed(path, body)
    except orjson.JSONDecodeError as e:
        problem = f"the body is not JSON: {e}"
    if problem:  # what OpenAI and Anthropic answer a request of the wrong shape
        start_response("400 Bad Request", [("Content-Type", "application/json")])
        return [orjson.dumps({"type": "error", "error": {"message": problem, "type": "invalid_request_error"}})]
    m = _SLEEP.search(raw)
    if m or DELAY_S:
        time.sleep(float(m.group(1)) if m else DELAY_S)
    if b"!500" in raw:
        start_response("500 Internal Server Error", [("Content-Type", "application/json")])
        return [b'{"error":{"message":"stub exploded","type":"server_error"}}']
    if b"!429" in raw:  # rate limited, as OpenAI and Anthropic answer it: retry-after in seconds
        start_response("429 Too Many Requests", [("Content-Type", "application/json"), ("retry-after", "7"),
                                                 ("x-ratelimit-remaining-requests", "0")])
        return [b'{"error":{"message":"rate limit reached","type":"rate_limit_error"}}']
    if b"!notjson" in raw:  # a broken provider (or a proxy's HTML page) with a success status
        start_response("200 OK", [("Content-Type", "text/html")])
        return [b"<html>gateway hiccup</html>"]
    if b"!400" in raw:
        start_response("400 Bad Request", [("Content-Type", "application/json")])
        return [b'{"error":{"message":"stub refuses this request","type":"invalid_request_error"}}']
    last = _last_user_text(body)
    out = handler(body, _answer(body, last))
    if isinstance(out, list):
        start_response("200 OK", [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")])
        return out
    start_response("200 OK", [("Content-Type", "application/json")])
    return [orjson.dumps(out)]


def serve_in_thread(port: int = 0):
    """Start the stub on 127.0.0.1 in a daemon thread (for tests); returns (server, base_url)."""
    from werkzeug.serving import make_server
    srv = make_server("127.0.0.1", port, app, threaded=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_port}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="answer every request after this long")
    a = ap.parse_args()
    from granian import Granian
    from granian.constants import Interfaces
    os.environ["REEF_STUB_DELAY_MS"] = str(a.delay_ms)  # the worker process re-imports this module
    Granian("reef_lab.testing.stub_provider:app", address="127.0.0.1", port=a.port, interface=Interfaces.WSGI,
            blocking_threads=a.threads, log_level="warning").serve()
