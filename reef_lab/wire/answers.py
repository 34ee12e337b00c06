"""Generations as the providers' answers: a Generation rendered into the dialect's response object, or streamed as
its server-sent events, with the tool calls parsed out of the text (reef_lab/engines/tools.py) in each dialect's
shape (docs/tools.md). dialects.py re-exports what the gateway uses (render, stream, tool_record, new_response_id).

Call ids are derived from the response id and the call's index, so a stream and its record (rendered once the
stream ends) name each call alike.
"""

from __future__ import annotations

import uuid
from typing import Callable, Iterable, Iterator

import orjson

from reef_lab.engines.base import Generation
from reef_lab.engines.tools import ParsedCall, ToolCallParser, ToolUse, parse_turn
from reef_lab.wire import responses_tools
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES


def sse(data: dict | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else orjson.dumps(data).decode()
    return (f"event: {event}\n" if event else "").encode() + b"data: " + payload.encode() + b"\n\n"


def parse_sse(event: bytes) -> tuple[str | None, str]:
    """One server-sent event's name (None when unnamed) and its data lines joined."""
    name, data = None, []
    for line in event.decode(errors="replace").split("\n"):
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    return name, "\n".join(data)


FINAL_EVENTS = ("message_stop", "response.completed", "response.incomplete", "response.failed")


def is_final_event(obj: dict) -> bool:
    """An Anthropic or Responses stream's last event (a chat stream's end is `[DONE]`, no event of its own)."""
    return obj.get("type") in FINAL_EVENTS


def receipt_end(dialect: str, response: dict, final: dict | None, final_event: str | None, reef: dict) -> list[bytes]:
    """A relayed stream's end with the receipt: chat gets a last chunk carrying `reef` before `[DONE]`; the others
    their held-back final event with `reef` added."""
    if dialect == OPENAI_CHAT:
        return [sse({"id": response.get("id"), "object": "chat.completion.chunk", "created": response.get("created"),
                     "model": response.get("model"), "choices": [], "reef": reef}), b"data: [DONE]\n\n"]
    return [] if final is None else [sse({**final, "reef": reef}, final_event)]


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
                output.append(_call_item(rid, part, tool_use))
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


def _tool_use_block(rid: str, tc: ParsedCall) -> dict:
    return {"type": "tool_use", "id": call_id(ANTHROPIC, rid, tc.index), "name": tc.name, "input": tc.arguments}


def _message_id(rid: str, n: int) -> str:
    return "msg_" + rid[5:] + (f"_{n}" if n else "")


def _responses_message(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(rid: str, tc: ParsedCall, tool_use: ToolUse | None) -> dict:
    """A call as the Responses item of the client's own tool kind (function, custom, local shell: responses_tools)."""
    return responses_tools.call_item(tc, tool_use, rid[5:], call_id(OPENAI_RESPONSES, rid, tc.index), "completed")


def _responses_object(rid, model, created, status, output, usage, incomplete=False, tool_use=None) -> dict:
    obj = {"id": rid, "object": "response", "created_at": created, "model": model, "output": output,
           "status": "incomplete" if incomplete else status, "error": None,
           "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
           "parallel_tool_calls": tool_use.parallel if tool_use else False,
           "tool_choice": _responses_choice(tool_use), "tools": responses_tools.listed_tools(tool_use),
           "instructions": None,
           "metadata": {}, "temperature": None, "top_p": None}
    if usage is not None:
        p, c = usage
        obj["usage"] = {"input_tokens": p, "output_tokens": c, "total_tokens": p + c,
                        "input_tokens_details": {"cached_tokens": 0},
                        "output_tokens_details": {"reasoning_tokens": 0}}
    return obj


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


def _parts(deltas: Iterable[str], tool_use: ToolUse | None) -> Iterator[str | ParsedCall]:
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
        item = _call_item(rid, part, tool_use)
        yield ev("response.output_item.added", output_index=index, item=responses_tools.started(item))
        for kind, fields in responses_tools.input_events(item, _pieces):
            yield ev(kind, item_id=item["id"], output_index=index, **fields)
        yield ev("response.output_item.done", output_index=index, item=item)
    gen, receipt = finish()
    if index < 0:
        yield from open_message()
    if open_msg is not None:
        yield from close_message()
    final = render(OPENAI_RESPONSES, gen, model, rid, created, tool_use)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield ev(kind, response=final, reef={"agent_record_id": receipt, "release_id": gen.release_id})
