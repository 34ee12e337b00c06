"""The providers' wire formats: OpenAI chat completions, OpenAI responses, Anthropic messages.

Each dialect parses its request body into a `ChatRequest` for engines that generate (the embedded model), renders
a `Generation` back into the provider's response object, streams it as the provider's server-sent events, and
accumulates a relayed stream back into one response object for the record. Tool calls: the requests' tool fields are
read by tools.py, generated text is parsed for calls by reef_lab/engines/tools.py, and the calls are rendered and
streamed here in each dialect's shape (docs/tools.md). The receipt rides in the final event
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
from reef_lab.engines.tools import ToolCall, ToolCallParser, ToolUse, parse_turn
from reef_lab.errors import BadRequest
from reef_lab.gateway import tools
from reef_lab.gateway.tools import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES


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
    tool_use = tools.read_tool_use(body, OPENAI_RESPONSES)
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
            if kind == "function_call":
                args = tools.arguments_of(item.get("arguments"), f"{where}.arguments")
                h.assistant("", [h.call(where, item.get("call_id"), item.get("name"), args, "call_id")], join=True)
            elif kind == "function_call_output":
                h.result(f"{where}.call_id", item.get("call_id"), _text_of(item.get("output"), f"{where}.output"))
            elif kind != "message":
                raise BadRequest(f"{where}: only message, function_call and function_call_output items are supported "
                                 "by this engine")
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
    return ChatRequest(h.messages, params, tool_use=tool_use)


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


def parse_count_tokens(body: dict) -> list[dict]:
    return parse_anthropic({**_check_object(body), "max_tokens": 1}).messages


PARSERS: dict[str, Callable[[dict], ChatRequest]] = {
    OPENAI_CHAT: parse_openai_chat, OPENAI_RESPONSES: parse_openai_responses, ANTHROPIC: parse_anthropic}


# ---- rendering a Generation -----------------------------------------------------------------------------------
def new_response_id(dialect: str) -> str:
    prefix = {OPENAI_CHAT: "chatcmpl-", OPENAI_RESPONSES: "resp_", ANTHROPIC: "msg_"}[dialect]
    return prefix + uuid.uuid4().hex


def call_id(dialect: str, rid: str, index: int) -> str:
    """The id of an answer's `index`-th tool call, derived from the response id so that a stream and the record
    (rendered once the stream ends) name each call alike."""
    return ("toolu_" if dialect == ANTHROPIC else "call_") + rid[-24:] + f"{index:02d}"


def _usage(gen: Generation) -> tuple[int, int]:
    return len(gen.prompt_token_ids), len(gen.token_ids)


def _answer(gen: Generation, tool_use: ToolUse | None) -> str:
    """The assistant turn's text: the tool-choice prefill the prompt ended with, then what was generated."""
    return (tool_use.prefill() if tool_use else "") + gen.text


def render(dialect: str, gen: Generation, model: str, rid: str, created: int,
           tool_use: ToolUse | None = None) -> dict:
    """The provider's response object. With tools, the text is parsed for calls (reef_lab/engines/tools.py)."""
    p, c = _usage(gen)
    turn = parse_turn(tool_use, _answer(gen, tool_use))
    calls = turn.calls
    if dialect == OPENAI_CHAT:
        texts = turn.texts
        empty = None if tool_use is not None else ""  # with tools, null as the stream starts it
        msg = {"role": "assistant", "content": "\n".join(texts) if texts else empty, "refusal": None}
        if calls:
            msg["tool_calls"] = [{"id": call_id(dialect, rid, tc.index), "type": "function",
                                  "function": {"name": tc.name, "arguments": tc.arguments_json()}} for tc in calls]
        return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": msg, "logprobs": None,
                             "finish_reason": "tool_calls" if calls else gen.finish_reason}],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}
    if dialect == OPENAI_RESPONSES:
        output, m = [], 0
        for part in turn.parts:
            if isinstance(part, str):
                output.append(_responses_message(_message_id(rid, m), part, "completed"))
                m += 1
            else:
                output.append(_function_call_item(rid, part, "completed"))
        return _responses_object(rid, model, created, "completed",
                                 output or [_responses_message(_message_id(rid, 0), "", "completed")], (p, c),
                                 incomplete=gen.finish_reason == "length" and not calls, tool_use=tool_use)
    content = [{"type": "text", "text": part} if isinstance(part, str) else _tool_use_block(rid, part)
               for part in turn.parts]
    return {"id": rid, "type": "message", "role": "assistant", "model": model,
            "content": content or [{"type": "text", "text": ""}], "stop_reason": _stop_reason(gen, bool(calls)),
            "stop_sequence": gen.stop_sequence, "usage": {"input_tokens": p, "output_tokens": c}}


def tool_record(dialect: str, gen: Generation, rid: str, tool_use: ToolUse | None) -> dict | None:
    """What a record keeps of a tool-using answer (its `metadata`), so learning reads the calls without parsing:
    the calls with their ids, the `<tool_call>`s that did not parse (kept in the text) and why, calls dropped with
    parallel calls off, and the prefill the prompt ended with (in prompt_token_ids, not generated). None without
    tools."""
    if tool_use is None:
        return None
    turn = parse_turn(tool_use, _answer(gen, tool_use))
    out: dict = {"tool_calls": [{"id": call_id(dialect, rid, tc.index), "name": tc.name, "arguments": tc.arguments}
                                for tc in turn.calls]}
    if turn.errors:
        out["tool_call_errors"] = turn.errors
    if turn.dropped:
        out["tool_calls_dropped"] = [{"name": tc.name, "arguments": tc.arguments} for tc in turn.dropped]
    if tool_use.prefill():
        out["prefill"] = tool_use.prefill()
    return out


def _stop_reason(gen: Generation, called: bool) -> str:
    if called:
        return "tool_use"
    return {"length": "max_tokens"}.get(gen.finish_reason, "stop_sequence" if gen.stop_sequence else "end_turn")


def _tool_use_block(rid: str, tc: ToolCall) -> dict:
    return {"type": "tool_use", "id": call_id(ANTHROPIC, rid, tc.index), "name": tc.name, "input": tc.arguments}


def _message_id(rid: str, n: int) -> str:
    return "msg_" + rid[5:] + (f"_{n}" if n else "")


def _responses_message(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _function_call_item(rid: str, tc: ToolCall, status: str) -> dict:
    return {"type": "function_call", "id": f"fc_{rid[5:]}_{tc.index}", "call_id": call_id(OPENAI_RESPONSES, rid, tc.index),
            "name": tc.name, "arguments": tc.arguments_json() if status == "completed" else "", "status": status}


def _responses_object(rid, model, created, status, output, usage, incomplete=False, tool_use=None) -> dict:
    obj = {"id": rid, "object": "response", "created_at": created, "model": model, "output": output,
           "status": "incomplete" if incomplete else status, "error": None,
           "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
           "parallel_tool_calls": tool_use.parallel if tool_use else False,
           "tool_choice": _responses_choice(tool_use), "tools": _responses_tools(tool_use), "instructions": None,
           "metadata": {}, "temperature": None, "top_p": None}
    if usage is not None:
        p, c = usage
        obj["usage"] = {"input_tokens": p, "output_tokens": c, "total_tokens": p + c,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 0}}
    return obj


def _responses_tools(tool_use: ToolUse | None) -> list[dict]:
    """The request's tools as a Responses object lists them (`strict` false: schemas are not enforced)."""
    return [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
             "parameters": t["function"]["parameters"], "strict": False} for t in (tool_use.tools if tool_use else [])]


def _responses_choice(tool_use: ToolUse | None):
    if tool_use is None:
        return "auto"
    if tool_use.choice == "function":
        return {"type": "function", "name": tool_use.function}
    return tool_use.choice


# ---- streaming a Generation -----------------------------------------------------------------------------------
def stream(dialect: str, deltas: Iterable[str], finish: Callable[[], tuple[Generation, str]], model: str,
           rid: str, created: int, prompt_tokens: int = 0, tool_use: ToolUse | None = None) -> Iterator[bytes]:
    """Server-sent events for a generation. `finish()` runs after the last delta: it returns the Generation and
    the receipt of its record (written durably by then), which rides in the final event. With tools, text is held
    back while it may be the start of a `<tool_call>`, and a call is streamed once it is complete and parses."""
    parts = _parts(deltas, tool_use)
    if dialect == ANTHROPIC:
        return _stream_anthropic(parts, finish, model, rid, created, prompt_tokens, tool_use)
    fn = {OPENAI_CHAT: _stream_chat, OPENAI_RESPONSES: _stream_responses}[dialect]
    return fn(parts, finish, model, rid, created, tool_use)


def _parts(deltas: Iterable[str], tool_use: ToolUse | None) -> Iterator[str | ToolCall]:
    parser = ToolCallParser(tool_use)
    if tool_use is not None and tool_use.prefill():
        yield from parser.feed(tool_use.prefill())
    for d in deltas:
        yield from parser.feed(d)
    yield from parser.close()


def _pieces(text: str, size: int = 32) -> list[str]:
    """A call's arguments in several deltas, as providers stream them."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _stream_chat(parts, finish, model, rid, created, tool_use):
    def chunk(delta, finish_reason=None):
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    # with tools the content starts null, as OpenAI's does for answers that may be only calls (render's null)
    yield sse(chunk({"role": "assistant", "content": None if tool_use is not None else ""}))
    calls, texted, separate = 0, False, False
    for part in parts:
        if isinstance(part, str):  # text segments around calls are joined by a newline, as render joins them
            yield sse(chunk({"content": ("\n" if separate else "") + part}))
            texted, separate = True, False
            continue
        head = {"index": part.index, "id": call_id(OPENAI_CHAT, rid, part.index), "type": "function",
                "function": {"name": part.name, "arguments": ""}}
        yield sse(chunk({"tool_calls": [head]}))
        for piece in _pieces(part.arguments_json()):
            yield sse(chunk({"tool_calls": [{"index": part.index, "function": {"arguments": piece}}]}))
        calls, separate = calls + 1, texted
    gen, receipt = finish()
    yield sse(chunk({}, "tool_calls" if calls else gen.finish_reason))
    p, c = _usage(gen)
    yield sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
               "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
               "reef": {"agent_record_id": receipt, "release_id": gen.release_id}})
    yield b"data: [DONE]\n\n"


def _stream_anthropic(parts, finish, model, rid, created, prompt_tokens, tool_use):
    def block_start(index, block):
        return sse({"type": "content_block_start", "index": index, "content_block": block}, "content_block_start")

    def block_stop(index):
        return sse({"type": "content_block_stop", "index": index}, "content_block_stop")

    def block_delta(index, delta):
        return sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta")
    yield sse({"type": "message_start", "message": {
        "id": rid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}}, "message_start")
    index, text_open = -1, False
    if tool_use is None:  # without tools the text block opens at once, as it always did
        index, text_open = 0, True
        yield block_start(0, {"type": "text", "text": ""})
    for part in parts:
        if isinstance(part, str):
            if not text_open:
                index, text_open = index + 1, True
                yield block_start(index, {"type": "text", "text": ""})
            yield block_delta(index, {"type": "text_delta", "text": part})
            continue
        if text_open:
            yield block_stop(index)
        index, text_open = index + 1, False
        yield block_start(index, {**_tool_use_block(rid, part), "input": {}})
        for piece in _pieces(part.arguments_json()):
            yield block_delta(index, {"type": "input_json_delta", "partial_json": piece})
        yield block_stop(index)
    gen, receipt = finish()
    final = render(ANTHROPIC, gen, model, rid, created, tool_use)
    if index < 0:  # nothing at all was generated: one empty text block, as the rendered answer has
        index, text_open = 0, True
        yield block_start(0, {"type": "text", "text": ""})
    if text_open:
        yield block_stop(index)
    yield sse({"type": "message_delta", "delta": {"stop_reason": final["stop_reason"],
                                                  "stop_sequence": final["stop_sequence"]},
               "usage": final["usage"]}, "message_delta")
    yield sse({"type": "message_stop", "reef": {"agent_record_id": receipt, "release_id": gen.release_id}},
              "message_stop")


def _stream_responses(parts, finish, model, rid, created, tool_use):
    seq = iter(range(1 << 30))

    def ev(kind, **fields):
        return sse({"type": kind, "sequence_number": next(seq), **fields}, kind)
    head = _responses_object(rid, model, created, "in_progress", [], None, tool_use=tool_use)
    yield ev("response.created", response=head)
    yield ev("response.in_progress", response=head)
    index, messages, open_msg = -1, 0, None  # open_msg: [item id, output index, text so far]
    part0 = {"type": "output_text", "text": "", "annotations": []}

    def open_message():
        nonlocal index, messages, open_msg
        index, messages = index + 1, messages + 1
        open_msg = [_message_id(rid, messages - 1), index, []]
        item = {"type": "message", "id": open_msg[0], "status": "in_progress", "role": "assistant", "content": []}
        return [ev("response.output_item.added", output_index=index, item=item),
                ev("response.content_part.added", item_id=open_msg[0], output_index=index, content_index=0,
                   part=part0)]

    def close_message():
        nonlocal open_msg
        mid, i, text = open_msg[0], open_msg[1], "".join(open_msg[2])
        open_msg = None
        return [ev("response.output_text.done", item_id=mid, output_index=i, content_index=0, text=text, logprobs=[]),
                ev("response.content_part.done", item_id=mid, output_index=i, content_index=0,
                   part={**part0, "text": text}),
                ev("response.output_item.done", output_index=i, item=_responses_message(mid, text, "completed"))]
    if tool_use is None:  # without tools the message item opens at once, as it always did
        yield from open_message()
    for part in parts:
        if isinstance(part, str):
            if open_msg is None:
                yield from open_message()
            open_msg[2].append(part)
            yield ev("response.output_text.delta", item_id=open_msg[0], output_index=open_msg[1], content_index=0,
                     delta=part, logprobs=[])
            continue
        if open_msg is not None:
            yield from close_message()
        index += 1
        item = _function_call_item(rid, part, "in_progress")
        yield ev("response.output_item.added", output_index=index, item=item)
        args = part.arguments_json()
        for piece in _pieces(args):
            yield ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece)
        yield ev("response.function_call_arguments.done", item_id=item["id"], output_index=index, name=part.name,
                 arguments=args)
        yield ev("response.output_item.done", output_index=index, item=_function_call_item(rid, part, "completed"))
    gen, receipt = finish()
    if index < 0:
        yield from open_message()
    if open_msg is not None:
        yield from close_message()
    final = render(OPENAI_RESPONSES, gen, model, rid, created, tool_use)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield ev(kind, response=final, reef={"agent_record_id": receipt, "release_id": gen.release_id})


def error_event(dialect: str, message: str, reef: dict | None = None) -> bytes:
    """A stream's last event when it fails after its 200 went out: the dialect's error event."""
    err = {"message": message, "type": "server_error"}
    if dialect == OPENAI_CHAT:
        return sse({"error": err, **({"reef": reef} if reef else {})})
    return sse({"type": "error", "error": err, **({"reef": reef} if reef else {})}, "error")


# ---- accumulating a relayed stream ----------------------------------------------------------------------------
class StreamAccumulator:
    """Rebuilds the response object of a relayed stream from its events, for the record."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.response: dict = {}
        self.text: list[str] = []
        self.tool_calls: dict[int, dict] = {}
        self.blocks: dict[int, dict] = {}

    def add(self, data: dict) -> None:
        if self.dialect == OPENAI_CHAT:
            self._add_chat(data)
        elif self.dialect == ANTHROPIC:
            self._add_anthropic(data)
        elif data.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            self.response = data.get("response") or {}

    def _add_chat(self, data: dict) -> None:
        r = self.response
        if not r:
            r.update({k: data.get(k) for k in ("id", "created", "model")}, object="chat.completion",
                     choices=[{"index": 0, "message": {"role": "assistant", "content": None},
                               "finish_reason": None}])
        if data.get("usage"):
            r["usage"] = data["usage"]
        for ch in data.get("choices") or []:
            if ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            if delta.get("content"):
                self.text.append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                cur = self.tool_calls.setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                                    "function": {"name": "", "arguments": ""}})
                cur["id"] = tc.get("id") or cur["id"]
                fn = tc.get("function") or {}
                cur["function"]["name"] += fn.get("name") or ""
                cur["function"]["arguments"] += fn.get("arguments") or ""
            if ch.get("finish_reason"):
                r["choices"][0]["finish_reason"] = ch["finish_reason"]

    def _add_anthropic(self, data: dict) -> None:
        t = data.get("type")
        if t == "message_start":
            self.response = dict(data.get("message") or {})
        elif t == "content_block_start":
            self.blocks[data.get("index", 0)] = dict(data.get("content_block") or {})
        elif t == "content_block_delta":
            b = self.blocks.setdefault(data.get("index", 0), {"type": "text", "text": ""})
            d = data.get("delta") or {}
            if d.get("type") == "text_delta":
                b["text"] = b.get("text", "") + d.get("text", "")
            elif d.get("type") == "input_json_delta":
                b["_json"] = b.get("_json", "") + d.get("partial_json", "")
            elif d.get("type") == "thinking_delta":
                b["thinking"] = b.get("thinking", "") + d.get("thinking", "")
        elif t == "message_delta":
            self.response.update(data.get("delta") or {})
            if data.get("usage"):
                self.response["usage"] = {**(self.response.get("usage") or {}), **data["usage"]}

    def result(self) -> dict:
        if self.dialect == OPENAI_CHAT and self.response:
            msg = self.response["choices"][0]["message"]
            msg["content"] = "".join(self.text) if self.text else None
            if self.tool_calls:
                msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        elif self.dialect == ANTHROPIC and self.response:
            blocks = []
            for i in sorted(self.blocks):
                b = dict(self.blocks[i])
                if "_json" in b:
                    raw = b.pop("_json")
                    try:
                        b["input"] = orjson.loads(raw) if raw else {}
                    except orjson.JSONDecodeError:
                        b["input"] = raw
                blocks.append(b)
            self.response["content"] = blocks
        return self.response


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
