"""The providers' wire formats: OpenAI chat completions, OpenAI responses, Anthropic messages.

Each dialect parses its request body into a `ChatRequest` for engines that generate (the embedded model), renders
a `Generation` back into the provider's response object and streams it as the provider's server-sent events (a
relayed stream is accumulated for its record by reef_lab/wire/accumulate.py). Tool calls: the requests' tool
fields are read by tools.py (a Responses request's tools that are not plain functions, hosted ones dropped, by
responses_tools.py), generated text is parsed for calls by reef_lab/engines/tools.py, and the calls are
rendered and streamed in each dialect's shape by answers.py (docs/tools.md). The receipt rides in the final event
of a stream (OpenAI chat: a last chunk with `"reef": {"agent_record_id": ...}` before `[DONE]`; Anthropic: on
`message_stop`; responses: on `response.completed`).
"""

from __future__ import annotations

import copy
import math
import time
from typing import Callable

import orjson

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.errors import BadRequest
from reef_lab.wire import responses_tools, tools
from reef_lab.wire.answers import call_id, new_response_id, render, sse, stream, tool_record  # noqa: F401
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES


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


def _check_object(body) -> dict:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def parse_openai_chat(body: dict) -> ChatRequest:
    _check_object(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    tool_use = tools.read_tool_use(body, OPENAI_CHAT)
    h = tools.History()
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise BadRequest(f"{where}.role must be one of system, developer, user, assistant, tool")
        if m["role"] == "tool":
            h.result(f"{where}.tool_call_id", m.get("tool_call_id"), _text_of(m.get("content"), where))
        elif m["role"] == "assistant":
            h.assistant(_text_of(m.get("content"), where), tools.chat_tool_calls(h, m, where))
        else:
            role = "system" if m["role"] == "developer" else m["role"]
            h.messages.append({"role": role, "content": _text_of(m.get("content"), where)})
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
    return ChatRequest(h.messages, params, tool_use=tool_use)


def parse_openai_responses(body: dict) -> ChatRequest:
    _check_object(body)
    offered = responses_tools.read_tools(body)
    tool_use = tools.read_tool_use(body, OPENAI_RESPONSES, offered.functions, offered.wire)
    h = tools.History()
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise BadRequest("'instructions' must be a string")
        h.messages.append({"role": "system", "content": body["instructions"]})
    inp = body.get("input")
    if isinstance(inp, str):
        h.messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list) and inp:
        for i, item in enumerate(inp):
            where = f"input[{i}]"
            kind = item.get("type", "message") if isinstance(item, dict) else None
            if kind != "message":
                if not responses_tools.read_item(h, kind, item, where, _text_of):
                    raise BadRequest(f"{where}: an item of type {kind!r} is not supported by this engine (only "
                                     "messages, and the calls and outputs of function, custom and local_shell tools)")
            elif item.get("role") not in ("system", "developer", "user", "assistant"):
                raise BadRequest(f"{where}.role must be one of system, developer, user, assistant")
            else:
                role = item["role"]
                h.messages.append({"role": "system" if role == "developer" else role,
                                   "content": _text_of(item.get("content"), where)})
    else:
        raise BadRequest("'input' must be a string or a non-empty list of input items")
    params = SamplingParams(
        max_tokens=_number(body, "max_output_tokens", 1, 32768, 256, integer=True),
        temperature=_number(body, "temperature", 0, 2, 1.0),
        top_p=_number(body, "top_p", 0, 1, 1.0),
        seed=_number(body, "seed", -2**63, 2**63 - 1, None, integer=True),
    )
    return ChatRequest(h.messages, params, tool_use=tool_use, dropped=offered.dropped)


def parse_anthropic(body: dict) -> ChatRequest:
    _check_object(body)
    if body.get("max_tokens") is None:
        raise BadRequest("'max_tokens' is required")
    tool_use = tools.read_tool_use(body, ANTHROPIC)
    h = tools.History()
    system = body.get("system")
    if system is not None:
        h.messages.append({"role": "system", "content": _text_of(system, "system")})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise BadRequest(f"messages[{i}].role must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")
                                             for b in content):
            tools.anthropic_blocks(h, m["role"], content, f"messages[{i}]", _text_of)
        else:
            h.messages.append({"role": m["role"], "content": _text_of(content, f"messages[{i}]")})
    params = SamplingParams(
        max_tokens=_number(body, "max_tokens", 1, 32768, 256, integer=True),
        temperature=_number(body, "temperature", 0, 1, 1.0),
        top_p=_number(body, "top_p", 0, 1, 1.0),
        stop=_stop_list(body.get("stop_sequences"), "stop_sequences"),
    )
    return ChatRequest(h.messages, params, tool_use=tool_use)


def with_system(dialect: str, body: dict, text: str) -> dict:
    """The request body with system `text` (a harness's) in front of the client's own instructions, in the
    dialect's place for it: chat, a first system message; responses, `instructions`; Anthropic, `system` (a copy;
    body is untouched)."""
    if not text:
        return body
    out = copy.copy(body)
    if dialect == OPENAI_CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("'messages' must be a list of message objects")
        out["messages"] = [{"role": "system", "content": text}] + messages
    elif dialect == OPENAI_RESPONSES:
        own = body.get("instructions")
        if own is not None and not isinstance(own, str):
            raise BadRequest("'instructions' must be a string")
        out["instructions"] = text + (f"\n\n{own}" if own else "")
    elif dialect == ANTHROPIC:
        own = body.get("system")
        if isinstance(own, list):
            out["system"] = [{"type": "text", "text": text}] + own
        elif own is None or isinstance(own, str):
            out["system"] = text + (f"\n\n{own}" if own else "")
        else:
            raise BadRequest("'system' must be a string or a list of text blocks")
    return out


def engine_request(dialect: str, body: dict) -> ChatRequest:
    """The request as generation reads it: messages, tools, tool choice (a learner re-making a served prompt, with
    or without a context, templates this with Engine.request_ids: the relay's reader merges system messages as a
    provider would, which changes the tokens)."""
    if dialect not in PARSERS:
        raise ValueError(f"unknown dialect {dialect!r}; known: {sorted(PARSERS)}")
    return PARSERS[dialect](body)


def parse_count_tokens(body: dict) -> list[dict]:
    return parse_anthropic({**_check_object(body), "max_tokens": 1}).messages


PARSERS: dict[str, Callable[[dict], ChatRequest]] = {
    OPENAI_CHAT: parse_openai_chat, OPENAI_RESPONSES: parse_openai_responses, ANTHROPIC: parse_anthropic}


def error_event(dialect: str, message: str, reef: dict | None = None) -> bytes:
    """A stream's last event when it fails after its 200 went out: the dialect's error event."""
    err = {"message": message, "type": "server_error"}
    if dialect == OPENAI_CHAT:
        return sse({"error": err, **({"reef": reef} if reef else {})})
    return sse({"type": "error", "error": err, **({"reef": reef} if reef else {})}, "error")


def now() -> int:
    return int(time.time())
