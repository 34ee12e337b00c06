"""A scripted model provider on loopback for agent tests: Anthropic messages, OpenAI chat and OpenAI Responses.

Real agent clients (Claude Code, Codex CLI, opencode) and the SDKs drive a two-turn task against it, as they would
against a real provider:

- turn 1 (no tool result in the conversation yet): when the conversation asks for `REEF-TASK path=<abs path>
  content=<word>`, it answers with a call of a file-writing tool taken from the request's own `tools` (a write tool
  with a path and a content argument, `apply_patch`, or a shell tool), with the arguments that write that file;
- turn 2 (a tool result is there): a short text answer, `Wrote the file.`;
- any other request (an agent's side calls: titles, summaries): a short text answer;
- reef_lab's change-request proposer (reef_lab/harness/change_requests.py, on chat completions): mutation JSON made from
  the request text: a rules entry and a skill `req-<hash>` that quote it; `REEF-PROPOSE <json>` in the request
  answers that JSON as it is, `REEF-PROPOSE-GARBAGE` answers prose; the reviewer accepts unless the request says
  `REEF-REJECT`.

It answers each dialect in its own wire format, streaming (event by event, flushed) or not, with thinking/reasoning
when the request asks for it (Anthropic thinking with a signature, chat `reasoning_content`, a Responses reasoning
item), and logs every request: method, path, query, headers and body (`requests`). `speaks` limits the routes it
serves (a chat-only provider answers 404 on /v1/messages, as vLLM or llama.cpp do). `REEF-FAIL status=<code>` in a
body gets that status with the dialect's error object; `REEF-FAIL-STREAM` breaks a stream off after its first
events with the dialect's error event. `responses_completed_output=False` sends `response.completed`
with `output: []` (as some providers do; the items came in the stream). TCP_NODELAY is set on every connection
(without it each relayed call waits ~40 ms for a delayed ACK).

Run it alone: `python -m reef_lab.testing.scripted_provider --port 9100`.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson

TASK = re.compile(r"REEF-TASK path=(/[A-Za-z0-9_./-]+) content=([A-Za-z0-9_-]+)")
FAIL = re.compile(rb"REEF-FAIL status=(\d{3})")
DONE_TEXT = "Wrote the file."
CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"
ALL = ("chat", "responses", "messages")
ROUTE_NAMES = {CHAT: "chat", RESPONSES: "responses", MESSAGES: "messages"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def sse(obj: dict | str, event: str | None = None) -> bytes:
    data = obj if isinstance(obj, str) else orjson.dumps(obj).decode()
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


# ---- what the request holds -------------------------------------------------------------------------------------
def has_tool_result(path: str, body: dict) -> bool:
    if path == RESPONSES:
        items = body.get("input") if isinstance(body.get("input"), list) else []
        return any(isinstance(i, dict) and str(i.get("type", "")).endswith("_output") for i in items)
    for m in body.get("messages") or []:
        if m.get("role") == "tool":
            return True
        if isinstance(m.get("content"), list) and any(
                isinstance(b, dict) and b.get("type") == "tool_result" for b in m["content"]):
            return True
    return False


def tools_of(path: str, body: dict) -> list[dict]:
    """The request's tools as {name, kind: function|custom, properties}."""
    out = []
    for t in body.get("tools") or []:
        if path == CHAT and t.get("type") == "function":
            fn = t.get("function") or {}
            out.append({"name": fn.get("name"), "kind": "function",
                        "properties": (fn.get("parameters") or {}).get("properties") or {}})
        elif path == RESPONSES and t.get("type") in ("function", "custom"):
            out.append({"name": t.get("name"), "kind": t["type"],
                        "properties": (t.get("parameters") or {}).get("properties") or {}})
        elif path == MESSAGES and "input_schema" in t:
            out.append({"name": t.get("name"), "kind": "function",
                        "properties": (t.get("input_schema") or {}).get("properties") or {}})
    return out


def writing_call(tools: list[dict], file: str, content: str) -> tuple[dict, dict | str] | None:
    """(tool, arguments) of the first tool that can write `content` to `file`: a write tool, apply_patch, a shell."""
    for t in tools:
        props = t["properties"]
        key = next((k for k in ("file_path", "filePath", "path") if k in props), None)
        if key and "content" in props:
            return t, {key: file, "content": content}
    patch = f"*** Begin Patch\n*** Add File: {file}\n+{content}\n*** End Patch\n"
    for t in tools:
        if t["name"] == "apply_patch":
            return t, (patch if t["kind"] == "custom" else {"input": patch})
    script = f"printf '%s' {shlex.quote(content)} > {shlex.quote(file)}"
    for t in tools:
        props = t["properties"]
        if "command" in props and (props["command"].get("type") == "array"):
            return t, {"command": ["bash", "-lc", script]}
        if "cmd" in props:
            return t, {"cmd": script}
        if "command" in props:
            return t, {"command": script}
    return None


def wants_thinking(path: str, body: dict) -> bool:
    if path == MESSAGES:
        return (body.get("thinking") or {}).get("type") in ("enabled", "adaptive")
    if path == CHAT:
        return bool(body.get("reasoning_effort"))
    return bool((body.get("reasoning") or {}).get("effort"))


PROPOSER, REVIEWER = "You are reef_lab's harness proposer.", "You are reef_lab's harness reviewer."
REQUEST = re.compile(r"<request>\n(.*?)\n</request>", re.S)


def change_request_answer(path: str, body: dict) -> str | None:
    """The proposer's or reviewer's answer when `body` is one of reef_lab's change-request prompts, else None."""
    messages = body.get("messages") if path == CHAT else None
    if not isinstance(messages, list) or len(messages) < 2 or not isinstance(messages[0].get("content"), str):
        return None
    system, user = messages[0]["content"], str(messages[-1].get("content"))
    found = REQUEST.search(user)
    text = found.group(1) if found else ""
    if system.startswith(REVIEWER):
        return orjson.dumps({"accept": "REEF-REJECT" not in text, "reason": "scripted review"}).decode()
    if not system.startswith(PROPOSER):
        return None
    if "REEF-PROPOSE-GARBAGE" in text:
        return "I think the agent should be more careful."
    if "REEF-PROPOSE " in text:
        return text.split("REEF-PROPOSE ", 1)[1]
    line = " ".join(text.split())
    name = "req-" + hashlib.sha256(line.encode()).hexdigest()[:8]
    return "```json\n" + orjson.dumps({"summary": f"scripted: {line[:80]}", "mutations": [
        {"op": "add", "kind": "rule", "text": line},
        {"op": "add", "kind": "skill", "name": name, "description": f"Use when: {line}",
         "text": f"Follow this request: {line}"}]}).decode() + "\n```"


class Plan:
    """What to answer: optional thinking text, then a text or a tool call."""

    def __init__(self, path: str, body: dict, raw: bytes):
        self.thinking = "Thinking about the task." if wants_thinking(path, body) else None
        self.text, self.call = DONE_TEXT, None
        task = TASK.search(raw.decode(errors="replace"))
        proposed = change_request_answer(path, body)
        if proposed is not None:
            self.text = proposed
        elif task and not has_tool_result(path, body):
            found = writing_call(tools_of(path, body), task.group(1), task.group(2))
            if found:
                tool, args = found
                self.text = "I will write the file."
                self.call = {"id": "call_" + uuid.uuid4().hex[:20], "name": tool["name"], "kind": tool["kind"],
                             "arguments": args if isinstance(args, str) else orjson.dumps(args).decode()}
        elif not task:
            self.text = "ok"
        self.input_tokens = max(1, len(raw) // 4)
        self.output_tokens = 12 if self.call else 4


def pieces(s: str, n: int = 3) -> list[str]:
    step = max(1, len(s) // n)
    return [s[i:i + step] for i in range(0, len(s), step)] or [""]


# ---- Anthropic messages -----------------------------------------------------------------------------------------
def messages_answer(body: dict, plan: Plan, stream: bool):
    mid, model = "msg_" + uuid.uuid4().hex[:24], body.get("model")
    blocks = []
    if plan.thinking:
        blocks.append({"type": "thinking", "thinking": plan.thinking, "signature": "sig-" + mid})
    blocks.append({"type": "text", "text": plan.text})
    if plan.call:
        blocks.append({"type": "tool_use", "id": plan.call["id"].replace("call_", "toolu_"),
                       "name": plan.call["name"], "input": orjson.loads(plan.call["arguments"])})
    stop = "tool_use" if plan.call else "end_turn"
    usage = {"input_tokens": plan.input_tokens, "output_tokens": plan.output_tokens,
             "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    msg = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": blocks,
           "stop_reason": stop, "stop_sequence": None, "usage": usage}
    if not stream:
        return msg
    out = [sse({"type": "message_start", "message": {**msg, "content": [], "stop_reason": None,
                                                        "usage": {**usage, "output_tokens": 1}}}, "message_start"),
              sse({"type": "ping"}, "ping")]
    for i, b in enumerate(blocks):
        if b["type"] == "thinking":
            start, deltas = {"type": "thinking", "thinking": "", "signature": ""}, \
                [{"type": "thinking_delta", "thinking": p} for p in pieces(b["thinking"])] + \
                [{"type": "signature_delta", "signature": b["signature"]}]
        elif b["type"] == "text":
            start, deltas = {"type": "text", "text": ""}, [{"type": "text_delta", "text": p}
                                                          for p in pieces(b["text"])]
        else:
            start = {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in pieces(plan.call["arguments"], 4)]
        out.append(sse({"type": "content_block_start", "index": i, "content_block": start}, "content_block_start"))
        out += [sse({"type": "content_block_delta", "index": i, "delta": d}, "content_block_delta") for d in deltas]
        out.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    out += [sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": plan.output_tokens}}, "message_delta"),
               sse({"type": "message_stop"}, "message_stop")]
    return out


# ---- OpenAI chat completions ------------------------------------------------------------------------------------
def chat_answer(body: dict, plan: Plan, stream: bool):
    cid, model, created = "chatcmpl-" + uuid.uuid4().hex[:24], body.get("model"), int(time.time())
    usage = {"prompt_tokens": plan.input_tokens, "completion_tokens": plan.output_tokens,
             "total_tokens": plan.input_tokens + plan.output_tokens}
    finish = "tool_calls" if plan.call else "stop"
    calls = [{"id": plan.call["id"], "type": "function",
              "function": {"name": plan.call["name"], "arguments": plan.call["arguments"]}}] if plan.call else None
    if not stream:
        msg = {"role": "assistant", "content": plan.text, "refusal": None}
        if plan.thinking:
            msg["reasoning_content"] = plan.thinking
        if calls:
            msg["tool_calls"] = calls
        return {"id": cid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}],
                "usage": usage}

    def chunk(delta, finish_reason=None):
        return sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]})
    out = [chunk({"role": "assistant", "content": ""})]
    if plan.thinking:
        out += [chunk({"reasoning_content": p}) for p in pieces(plan.thinking)]
    out += [chunk({"content": p}) for p in pieces(plan.text)]
    if calls:
        out.append(chunk({"tool_calls": [{"index": 0, "id": plan.call["id"], "type": "function",
                                          "function": {"name": plan.call["name"], "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                for p in pieces(plan.call["arguments"], 4)]
    out.append(chunk({}, finish))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": usage}))
    return out + [b"data: [DONE]\n\n"]


# ---- OpenAI Responses -------------------------------------------------------------------------------------------
def responses_answer(body: dict, plan: Plan, stream: bool, completed_output: bool = True):
    rid, created = "resp_" + uuid.uuid4().hex[:24], int(time.time())
    items = []
    if plan.thinking:
        item = {"type": "reasoning", "id": "rs_" + rid[5:], "summary": [{"type": "summary_text",
                                                                       "text": plan.thinking}]}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = "enc-" + rid
        items.append(item)
    items.append({"type": "message", "id": "msg_" + rid[5:], "status": "completed", "role": "assistant",
                  "content": [{"type": "output_text", "text": plan.text, "annotations": []}]})
    if plan.call:
        c = plan.call
        if c["kind"] == "custom":
            items.append({"type": "custom_tool_call", "id": "ctc_" + rid[5:], "call_id": c["id"], "name": c["name"],
                          "input": c["arguments"], "status": "completed"})
        else:
            items.append({"type": "function_call", "id": "fc_" + rid[5:], "call_id": c["id"], "name": c["name"],
                          "arguments": c["arguments"], "status": "completed"})
    usage = {"input_tokens": plan.input_tokens, "output_tokens": plan.output_tokens,
             "total_tokens": plan.input_tokens + plan.output_tokens, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens_details": {"reasoning_tokens": 4 if plan.thinking else 0}}
    resp = {"id": rid, "object": "response", "created_at": created, "model": body.get("model"),
            "status": "completed", "output": items, "error": None, "incomplete_details": None,
            "parallel_tool_calls": True, "tool_choice": body.get("tool_choice", "auto"), "tools": [],
            "usage": usage}
    if not stream:
        return resp
    seq = iter(range(1 << 20))
    out = []

    def ev(kind, **fields):
        out.append(sse({"type": kind, "sequence_number": next(seq), **fields}, kind))
    pending = {**resp, "status": "in_progress", "output": [], "usage": None}
    ev("response.created", response=pending)
    ev("response.in_progress", response=pending)
    for i, item in enumerate(items):
        ids = {"item_id": item["id"], "output_index": i}
        if item["type"] == "reasoning":
            ev("response.output_item.added", output_index=i, item={**item, "summary": []})
            part = {"type": "summary_text", "text": ""}
            ev("response.reasoning_summary_part.added", **ids, summary_index=0, part=part)
            for p in pieces(plan.thinking):
                ev("response.reasoning_summary_text.delta", **ids, summary_index=0, delta=p)
            ev("response.reasoning_summary_text.done", **ids, summary_index=0, text=plan.thinking)
            ev("response.reasoning_summary_part.done", **ids, summary_index=0, part={**part, "text": plan.thinking})
        elif item["type"] == "message":
            ev("response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": []}
            ev("response.content_part.added", **ids, content_index=0, part=part)
            for p in pieces(plan.text):
                ev("response.output_text.delta", **ids, content_index=0, delta=p, logprobs=[])
            ev("response.output_text.done", **ids, content_index=0, text=plan.text, logprobs=[])
            ev("response.content_part.done", **ids, content_index=0, part={**part, "text": plan.text})
        elif item["type"] == "custom_tool_call":
            ev("response.output_item.added", output_index=i, item={**item, "input": "", "status": "in_progress"})
            for p in pieces(item["input"], 4):
                ev("response.custom_tool_call_input.delta", **ids, delta=p)
            ev("response.custom_tool_call_input.done", **ids, input=item["input"])
        else:
            ev("response.output_item.added", output_index=i, item={**item, "arguments": "", "status": "in_progress"})
            for p in pieces(item["arguments"], 4):
                ev("response.function_call_arguments.delta", **ids, delta=p)
            ev("response.function_call_arguments.done", **ids, arguments=item["arguments"])
        ev("response.output_item.done", output_index=i, item=item)
    ev("response.completed", response=resp if completed_output else {**resp, "output": []})
    return out


def error_answer(route: str, status: int) -> dict:
    kind = ERROR_TYPES.get(status, "api_error")
    if route == MESSAGES:
        return {"type": "error", "error": {"type": kind, "message": f"scripted failure {status}"}}
    return {"error": {"message": f"scripted failure {status}", "type": kind, "param": None, "code": None}}


def stream_failure(route: str) -> bytes:
    err = {"message": "scripted stream failure", "type": "overloaded_error"}
    if route == MESSAGES:
        return sse({"type": "error", "error": err}, "error")
    if route == CHAT:
        return sse({"error": err})
    failed = {"id": "resp_failed", "object": "response", "status": "failed", "output": [],
              "error": {"code": "server_error", "message": err["message"]}}
    return sse({"type": "response.failed", "sequence_number": 99, "response": failed}, "response.failed")


# ---- the server -------------------------------------------------------------------------------------------------
class ScriptedProvider:
    """`with ScriptedProvider(speaks=("chat",)) as p:` serves on 127.0.0.1 (p.url) until the block ends."""

    def __init__(self, speaks=ALL, port: int = 0, responses_completed_output: bool = True,
                 delay_s: float = 0.0):
        self.speaks, self.requests, self.delay_s = tuple(speaks), [], delay_s
        self.responses_completed_output = responses_completed_output
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # TCP_NODELAY on the accepted socket

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                self._log(b"")
                if urllib.parse.urlsplit(self.path).path == "/v1/models":
                    self._json(200, {"object": "list", "data": [
                        {"id": "scripted", "object": "model", "created": 1, "owned_by": "scripted",
                         "type": "model", "display_name": "scripted", "created_at": "2025-01-01T00:00:00Z"}],
                        "has_more": False, "first_id": "scripted", "last_id": "scripted"})
                else:
                    self._json(404, {"error": {"message": "no such route", "type": "not_found_error"}})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = urllib.parse.urlsplit(self.path).path
                self._log(raw)
                if path == "/v1/messages/count_tokens" and "messages" in provider.speaks:
                    return self._json(200, {"input_tokens": max(1, len(raw) // 4)})
                if ROUTE_NAMES.get(path) not in provider.speaks:
                    return self._json(404, {"error": {"message": f"no route {path}", "type": "not_found_error"}})
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError as e:
                    return self._json(400, error_answer(path, 400) | {"detail": str(e)})
                fail = FAIL.search(raw)
                if fail:
                    status = int(fail.group(1))
                    return self._json(status, error_answer(path, status),
                                      {"retry-after": "3"} if status == 429 else None)
                if provider.delay_s:
                    time.sleep(provider.delay_s)
                plan, stream = Plan(path, body, raw), bool(body.get("stream"))
                if path == MESSAGES:
                    out = messages_answer(body, plan, stream)
                elif path == CHAT:
                    out = chat_answer(body, plan, stream)
                else:
                    out = responses_answer(body, plan, stream, provider.responses_completed_output)
                if not stream:
                    return self._json(200, out)
                if b"REEF-FAIL-STREAM" in raw:
                    out = out[:3] + [stream_failure(path)]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in out:  # one chunk per event, sent as it is made
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _log(self, raw: bytes) -> None:
                try:
                    body = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    body = raw.decode(errors="replace")
                u = urllib.parse.urlsplit(self.path)
                with provider._lock:
                    provider.requests.append({"method": self.command, "path": u.path, "query": u.query,
                                              "headers": {k.lower(): v for k, v in self.headers.items()},
                                              "body": body, "t": time.time()})

            def _json(self, status: int, obj: dict, headers: dict | None = None) -> None:
                data = orjson.dumps(obj)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def start(self) -> ScriptedProvider:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ScriptedProvider:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def calls(self, path: str) -> list[dict]:
        """The logged POSTs to `path`, in order."""
        with self._lock:
            return [r for r in self.requests if r["path"] == path and r["method"] == "POST"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=9100)
    ap.add_argument("--speaks", default=",".join(ALL), help="comma-separated: chat, responses, messages")
    ap.add_argument("--log", help="append every request as a JSON line to this file")
    a = ap.parse_args()
    p = ScriptedProvider(a.speaks.split(","), a.port)
    print(f"scripted provider on {p.url}", flush=True)
    try:
        p.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if a.log:
            with open(a.log, "ab") as f:
                for r in p.requests:
                    f.write(orjson.dumps(r) + b"\n")
