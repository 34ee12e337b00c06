"""The providers' wire formats: OpenAI chat completions, OpenAI responses, Anthropic messages.

Each dialect parses its request body into a `ChatRequest` for engines that generate (the embedded model), renders
a `Generation` back into the provider's response object and streams it as the provider's server-sent events (a
relayed stream is accumulated for its record by reef_lab/gateway/accumulate.py). The receipt rides in the final event
of a stream (OpenAI chat: a last chunk with `"reef": {"agent_record_id": ...}` before `[DONE]`; Anthropic: on
`message_stop`; responses: on `response.completed`).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Callable, Iterable, Iterator

import orjson

from reef_lab.engines.base import ChatRequest, Generation, SamplingParams
from reef_lab.errors import BadRequest

OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC = "openai.chat", "openai.responses", "anthropic.messages"


def sse(data: dict | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    return (f"event: {event}\n" if event else "").encode() + b"data: " + payload.encode() + b"\n\n"


# ---- request parsing ------------------------------------------------------------------------------------------
def _number(body: dict, key: str, lo: float, hi: float, default, integer: bool = False):
    v = body.get(key)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not math.isfinite(v) or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"'{key}' must be {kind} between {lo} and {hi}, got {v!r}")
    return v


def _text_of(content, where: str) -> str:
    """Message content as plain text: a string, or a list of text parts (other part types are refused)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                if not isinstance(part.get("text"), str):
                    raise BadRequest(f"{where}: a text part needs a string 'text'")
                out.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}: content part of type {kind!r} is not supported by this model "
                                 "(text only); send text parts or serve a multimodal upstream with --upstream-url")
        return "".join(out)
    raise BadRequest(f"{where}: content must be a string or a list of text parts")


def _stop_list(v, key: str) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(s, str) for s in v) and len(v) <= 16:
        return v
    raise BadRequest(f"'{key}' must be a string or a list of at most 16 strings")


def _no_tools(body: dict) -> None:
    if body.get("tools"):
        raise BadRequest("'tools' are not supported by the embedded model; serve a tool-calling model with "
                         "--upstream-url, or send the request without tools")


def _check_object(body) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_openai_chat(body: dict) -> ChatRequest:
    _check_object(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    _no_tools(body)
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant"):
            raise BadRequest(f"messages[{i}].role must be one of system, developer, user, assistant")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": _text_of(m.get("content"), f"messages[{i}]")})
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    params = SamplingParams(
        max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", 1, 32768, 256, integer=True),
        temperature=_number(body, "temperature", 0, 2, 1.0),
        top_p=_number(body, "top_p", 0, 1, 1.0),
        stop=_stop_list(body.get("stop"), "stop"),
        seed=_number(body, "seed", -2**63, 2**63 - 1, None, integer=True),
    )
    if _number(body, "n", 1, 1, 1, integer=True) != 1:
        raise BadRequest("'n' must be 1")
    return ChatRequest(out, params)


def parse_openai_responses(body: dict) -> ChatRequest:
    _check_object(body)
    _no_tools(body)
    out = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise BadRequest("'instructions' must be a string")
        out.append({"role": "system", "content": body["instructions"]})
    inp = body.get("input")
    if isinstance(inp, str):
        out.append({"role": "user", "content": inp})
    elif isinstance(inp, list) and inp:
        for i, item in enumerate(inp):
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                raise BadRequest(f"input[{i}]: only message items are supported by the embedded model")
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise BadRequest(f"input[{i}].role must be one of system, developer, user, assistant")
            out.append({"role": "system" if role == "developer" else role,
                        "content": _text_of(item.get("content"), f"input[{i}]")})
    else:
        raise BadRequest("'input' must be a string or a non-empty list of message items")
    params = SamplingParams(
        max_tokens=_number(body, "max_output_tokens", 1, 32768, 256, integer=True),
        temperature=_number(body, "temperature", 0, 2, 1.0),
        top_p=_number(body, "top_p", 0, 1, 1.0),
        seed=_number(body, "seed", -2**63, 2**63 - 1, None, integer=True),
    )
    return ChatRequest(out, params)


def parse_anthropic(body: dict) -> ChatRequest:
    _check_object(body)
    _no_tools(body)
    if body.get("max_tokens") is None:
        raise BadRequest("'max_tokens' is required")
    out = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "system")})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}].role must be 'user' or 'assistant'")
        out.append({"role": m["role"], "content": _text_of(m.get("content"), f"messages[{i}]")})
    params = SamplingParams(
        max_tokens=_number(body, "max_tokens", 1, 32768, 256, integer=True),
        temperature=_number(body, "temperature", 0, 1, 1.0),
        top_p=_number(body, "top_p", 0, 1, 1.0),
        stop=_stop_list(body.get("stop_sequences"), "stop_sequences"),
    )
    return ChatRequest(out, params)


def parse_count_tokens(body: dict) -> list[dict]:
    return parse_anthropic({**_check_object(body), "max_tokens": 1}).messages


PARSERS: dict[str, Callable[[dict], ChatRequest]] = {
    OPENAI_CHAT: parse_openai_chat, OPENAI_RESPONSES: parse_openai_responses, ANTHROPIC: parse_anthropic}


# ---- rendering a Generation -----------------------------------------------------------------------------------
def new_response_id(dialect: str) -> str:
    prefix = {OPENAI_CHAT: "chatcmpl-", OPENAI_RESPONSES: "resp_", ANTHROPIC: "msg_"}[dialect]
    return prefix + uuid.uuid4().hex


def _usage(gen: Generation) -> tuple[int, int]:
    return len(gen.prompt_token_ids), len(gen.token_ids)


def render(dialect: str, gen: Generation, model: str, rid: str, created: int) -> dict:
    p, c = _usage(gen)
    if dialect == OPENAI_CHAT:
        return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text, "refusal": None},
                             "logprobs": None, "finish_reason": gen.finish_reason}],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}
    if dialect == OPENAI_RESPONSES:
        return _responses_object(rid, model, created, "completed", gen.text, (p, c),
                                 incomplete=gen.finish_reason == "length")
    stop_reason = {"length": "max_tokens"}.get(gen.finish_reason,
                                               "stop_sequence" if gen.stop_sequence else "end_turn")
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": gen.text}], "stop_reason": stop_reason,
            "stop_sequence": gen.stop_sequence, "usage": {"input_tokens": p, "output_tokens": c}}


def _responses_message(rid: str, text: str, status: str) -> dict:
    return {"type": "message", "id": "msg_" + rid[5:], "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _responses_object(rid, model, created, status, text, usage, incomplete=False) -> dict:
    output = [] if text is None else [_responses_message(rid, text, "completed")]
    obj = {"id": rid, "object": "response", "created_at": created, "model": model, "output": output,
           "status": "incomplete" if incomplete else status, "error": None,
           "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
           "parallel_tool_calls": False, "tool_choice": "auto", "tools": [], "instructions": None,
           "metadata": {}, "temperature": None, "top_p": None}
    if usage is not None:
        p, c = usage
        obj["usage"] = {"input_tokens": p, "output_tokens": c, "total_tokens": p + c,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 0}}
    return obj


# ---- streaming a Generation -----------------------------------------------------------------------------------
def stream(dialect: str, deltas: Iterable[str], finish: Callable[[], tuple[Generation, str]], model: str,
           rid: str, created: int, prompt_tokens: int = 0) -> Iterator[bytes]:
    """Server-sent events for a generation. `finish()` runs after the last delta: it returns the Generation and
    the receipt of its record (written durably by then), which rides in the final event."""
    if dialect == ANTHROPIC:
        return _stream_anthropic(deltas, finish, model, rid, created, prompt_tokens)
    fn = {OPENAI_CHAT: _stream_chat, OPENAI_RESPONSES: _stream_responses}[dialect]
    return fn(deltas, finish, model, rid, created)


def _stream_chat(deltas, finish, model, rid, created):
    def chunk(delta, finish_reason=None):
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    yield sse(chunk({"role": "assistant", "content": ""}))
    for d in deltas:
        yield sse(chunk({"content": d}))
    gen, receipt = finish()
    yield sse(chunk({}, gen.finish_reason))
    p, c = _usage(gen)
    yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
               "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
               "reef": {"agent_record_id": receipt, "release_id": gen.release_id}})
    yield b"data: [DONE]\n\n"


def _stream_anthropic(deltas, finish, model, rid, created, prompt_tokens):
    yield sse({"type": "message_start", "message": {
        "id": rid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}}, "message_start")
    yield sse({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              "content_block_start")
    for d in deltas:
        yield sse({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": d}},
                  "content_block_delta")
    gen, receipt = finish()
    final = render(ANTHROPIC, gen, model, rid, created)
    yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    yield sse({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                  "stop_sequence": final["stop_sequence"]},
               "usage": final["usage"]}, "message_delta")
    yield sse({"type": "message_stop", "reef": {"agent_record_id": receipt, "release_id": gen.release_id}},
              "message_stop")


def _stream_responses(deltas, finish, model, rid, created):
    seq = iter(range(1 << 30))
    msg_id = "msg_" + rid[5:]

    def ev(kind, **fields):
        return sse({"type": kind, "sequence_number": next(seq), **fields}, kind)
    yield ev("response.created", response=_responses_object(rid, model, created, "in_progress", None, None))
    yield ev("response.in_progress", response=_responses_object(rid, model, created, "in_progress", None, None))
    item = {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}
    yield ev("response.output_item.added", output_index=0, item=item)
    part = {"type": "output_text", "text": "", "annotations": []}
    yield ev("response.content_part.added", item_id=msg_id, output_index=0, content_index=0, part=part)
    for d in deltas:
        yield ev("response.output_text.delta", item_id=msg_id, output_index=0, content_index=0, delta=d,
                 logprobs=[])
    gen, receipt = finish()
    yield ev("response.output_text.done", item_id=msg_id, output_index=0, content_index=0, text=gen.text,
             logprobs=[])
    yield ev("response.content_part.done", item_id=msg_id, output_index=0, content_index=0,
             part={**part, "text": gen.text})
    yield ev("response.output_item.done", output_index=0, item=_responses_message(rid, gen.text, "completed"))
    final = render(OPENAI_RESPONSES, gen, model, rid, created)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield ev(kind, response=final, reef={"agent_record_id": receipt, "release_id": gen.release_id})


def error_event(dialect: str, message: str, reef: dict | None = None) -> bytes:
    """A stream's last event when it fails after its 200 went out: the dialect's error event."""
    err = {"message": message, "type": "server_error"}
    if dialect == OPENAI_CHAT:
        return sse({"error": err, **({"reef": reef} if reef else {})})
    return sse({"type": "error", "error": err, **({"reef": reef} if reef else {})}, "error")


def now() -> int:
    return int(time.time())


# ---- text of stored records (one home for reading a dialect's request and answer as text) ----------------
def request_messages(dialect: str, request: dict) -> list[dict]:
    """The client's conversation as plain {role, content: str} messages, without system text."""
    def text(content) -> str:
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return ""

    if dialect == OPENAI_RESPONSES:
        inp = request.get("input")
        if isinstance(inp, str):
            return [{"role": "user", "content": inp}]
        items = inp if isinstance(inp, list) else []
    else:
        items = request.get("messages") or []
    return [{"role": m.get("role"), "content": text(m.get("content"))} for m in items
            if isinstance(m, dict) and m.get("role") in ("user", "assistant")]


def response_text(dialect: str, response) -> str:
    if not isinstance(response, dict):
        return ""
    if dialect == OPENAI_CHAT:
        choices = response.get("choices") or [{}]
        return (choices[0].get("message") or {}).get("content") or ""
    if dialect == OPENAI_RESPONSES:
        return "".join(c.get("text", "") for o in response.get("output") or [] if isinstance(o, dict)
                       for c in o.get("content") or [] if isinstance(c, dict))
    return "".join(c.get("text", "") for c in response.get("content") or [] if isinstance(c, dict))
