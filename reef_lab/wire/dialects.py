"""The providers' wire formats: OpenAI chat completions, OpenAI responses, Anthropic messages.

A request body is read by its dialect's one reader (translate/, strictly: what an engine here can serve) into a
`ChatRequest` for engines that generate (the embedded model); a `Generation` is rendered back into the provider's
response object and streamed as the provider's server-sent events (a relayed stream is accumulated for its record
by reef_lab/wire/accumulate.py). Tool calls: the requests' tool fields are checked by tools.py (a Responses
request's tools that are not plain functions, hosted ones dropped, by responses_tools.py), generated text is parsed
for calls by reef_lab/engines/tools.py, and the calls are rendered and streamed in each dialect's shape by
answers.py through translate/'s writers (docs/tools.md). The receipt rides in the final event of a stream
(OpenAI chat: a last chunk with `"reef": {"agent_record_id": ...}` before `[DONE]`; Anthropic: on `message_stop`;
responses: on `response.completed`).
"""

from __future__ import annotations

import copy
import json
import time
from typing import Callable

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.errors import BadRequest
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, responses_tools, tools
from reef_lab.wire.answers import call_id, new_response_id, render, sse, stream, tool_record  # noqa: F401
from reef_lab.wire.translate import MODULES
from reef_lab.wire.translate.ir import Conversation, Text, ToolCall, ToolResult


# ---- requests as an engine reads them --------------------------------------------------------------------------
def chat_request(conv: Conversation) -> ChatRequest:
    """A conversation read strictly (translate's `parse_request(body, strict=True)`) as an engine takes it: messages
    as transformers' chat templates take them (each system text its own message, a call's arguments an object, a
    custom tool's input as its one `input` argument, a tool result named by its call and, when the client marked it
    an error, prefixed "Error: "), the tools and tool choice as a ToolUse, and the sampling settings."""
    messages = [{"role": "system", "content": text} for text in conv.system]
    names: dict[str, str] = {}
    for turn in conv.turns:
        text = "".join(p.text for p in turn.parts if isinstance(p, Text))
        if turn.role == "assistant":
            calls = []
            for p in turn.parts:
                if isinstance(p, ToolCall):
                    names[p.id] = p.name
                    args = {responses_tools.CUSTOM_INPUT: p.arguments} if p.custom else json.loads(p.arguments)
                    calls.append({"id": p.id, "type": "function", "function": {"name": p.name, "arguments": args}})
            messages.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
            continue
        results = [p for p in turn.parts if isinstance(p, ToolResult)]
        for r in results:
            content = "".join(p.text for p in r.content)
            messages.append({"role": "tool", "tool_call_id": r.call_id, "name": names[r.call_id],
                             "content": "Error: " + content if r.is_error else content})
        if text or not results:
            messages.append({"role": turn.role, "content": text})
    functions, wire = [], {}
    for t in conv.tools:
        functions.append({"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description is not None else {}),
            "parameters": t.parameters}})
        if t.local_shell:
            wire[t.name] = {"type": responses_tools.LOCAL_SHELL}
        elif t.custom or t.name in conv.namespaces:
            ns, name = conv.namespaces.get(t.name, (None, t.name))
            wire[t.name] = {"type": "custom" if t.custom else "function", "name": name,
                            **({"namespace": ns} if ns else {})}
    params = SamplingParams(
        max_tokens=256 if conv.max_tokens is None else conv.max_tokens,
        temperature=1.0 if conv.temperature is None else conv.temperature,
        top_p=1.0 if conv.top_p is None else conv.top_p, stop=list(conv.stop), seed=conv.seed)
    return ChatRequest(messages, params, tool_use=tools.tool_use(functions, conv.tool_choice, conv.parallel_tool_calls,
                                                                 wire), dropped=list(conv.dropped))


def read_request(dialect: str, body: dict) -> Conversation:
    """The request read strictly by its dialect's reader (what an engine here can serve): a 400 naming the field
    otherwise. Generation keeps it: the answer is written from it (the client's tool kinds, what Responses echoes)."""
    if dialect not in MODULES:
        raise ValueError(f"unknown dialect {dialect!r}; known: {sorted(MODULES)}")
    return MODULES[dialect].parse_request(body, strict=True)


def engine_request(dialect: str, body: dict) -> ChatRequest:
    """The request as generation reads it: messages, tools, tool choice, sampling; a 400 naming the field when the
    dialect's reader refuses it or the engine cannot serve it (a learner re-making a served prompt, with or without
    a context, templates this with Engine.request_ids)."""
    return chat_request(read_request(dialect, body))


def parse_openai_chat(body: dict) -> ChatRequest:
    return engine_request(OPENAI_CHAT, body)


def parse_openai_responses(body: dict) -> ChatRequest:
    return engine_request(OPENAI_RESPONSES, body)


def parse_anthropic(body: dict) -> ChatRequest:
    return engine_request(ANTHROPIC, body)


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


def parse_count_tokens(body: dict) -> list[dict]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return parse_anthropic({**body, "max_tokens": 1}).messages


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
