"""Generations as the providers' answers: a Generation rendered into the dialect's response object, or streamed as
its server-sent events, with the tool calls parsed out of the text (reef_lab/engines/tools.py) in each dialect's
shape (docs/tools.md). dialects.py re-exports what the gateway uses (render, stream, tool_record, new_response_id).

A generation is said in the neutral form (translate/ir.py: an Answer, or a stream's events) and written by the
dialect's own writer in translate/, the one the relay writes with, so each dialect is written once (issue 51). What
is generation's own stays here: calls parsed out of the text, call ids (and Responses item ids) derived from the
response id, chat's text segments joined by a newline, the stream recorded as soon as its last part is read.

Call ids are derived from the response id and the call's index, so a stream and its record (rendered once the
stream ends) name each call alike.
"""

from __future__ import annotations

import uuid
from typing import Callable, Iterable, Iterator

import orjson

from reef_lab.engines.base import Generation
from reef_lab.engines.tools import ParsedCall, ToolCallParser, ToolUse, parse_turn
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from reef_lab.wire.translate import anthropic as anthropic_wire
from reef_lab.wire.translate import chat as chat_wire
from reef_lab.wire.translate import responses as responses_wire
from reef_lab.wire.translate import responses_stream
from reef_lab.wire.translate.ir import Answer, BlockStart, BlockStop, Conversation, Delta, Finish, Start, Text, Usage
from reef_lab.wire.translate.ir import ToolCall as WireCall


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


def _stop(gen: Generation, called: bool) -> str:
    """The neutral stop reason (translate/ir.py STOPS) of a generation."""
    if called:
        return "tool_calls"
    if gen.finish_reason == "length":
        return "length"
    return "stop_sequence" if gen.stop_sequence else "end"


def _wire_call(dialect: str, rid: str, tc: ParsedCall) -> WireCall:
    return WireCall(call_id(dialect, rid, tc.index), tc.name, tc.arguments_json())


def neutral_answer(dialect: str, gen: Generation, model: str, rid: str, created: int,
                   tool_use: ToolUse | None) -> Answer:
    """A generation in the neutral form: its text segments and parsed calls in order (chat's one content: the
    segments joined by a newline, before the calls), the stop, the usage."""
    turn = parse_turn(tool_use, _answer(gen, tool_use))
    calls = [_wire_call(dialect, rid, tc) for tc in turn.calls]
    if dialect == OPENAI_CHAT:
        parts = ([Text("\n".join(turn.texts))] if turn.texts else []) + calls
    else:
        parts = [Text(p) if isinstance(p, str) else _wire_call(dialect, rid, p) for p in turn.parts] or [Text("")]
    p, c = _usage(gen)
    return Answer(rid, model, parts, _stop(gen, bool(calls)), gen.stop_sequence, Usage(input=p, output=c), created)


def _item_ids(rid: str) -> responses_wire.ItemIds:
    """A Responses answer's item ids, derived from its response id: a stream and its record name each alike."""
    def ids(kind: str, n: int) -> str:
        if kind == "message":
            return "msg_" + rid[5:] + (f"_{n}" if n else "")
        return f"{ITEM_PREFIX.get(kind, 'rs')}_{rid[5:]}_{n}"
    return ids


ITEM_PREFIX = {"function_call": "fc", "custom_tool_call": "ctc", "local_shell_call": "lsh"}
NO_CONVERSATION = Conversation([], [])


def _writer(dialect: str, conv: Conversation, rid: str):
    if dialect == OPENAI_RESPONSES:
        return responses_stream.Writer(conv, _item_ids(rid))
    return {OPENAI_CHAT: chat_wire, ANTHROPIC: anthropic_wire}[dialect].Writer(conv)


def render(dialect: str, gen: Generation, model: str, rid: str, created: int,
           tool_use: ToolUse | None = None, conv: Conversation | None = None) -> dict:
    """The provider's response object, written by the dialect's writer (translate/). With tools, the text is parsed
    for calls (reef_lab/engines/tools.py); `conv` (the request as read) gives the client's tool kinds and what a
    Responses answer echoes (its tools, tool choice, parallel calls)."""
    ans, conv = neutral_answer(dialect, gen, model, rid, created, tool_use), conv or NO_CONVERSATION
    if dialect == OPENAI_RESPONSES:
        return responses_wire.build_answer(ans, conv, _item_ids(rid))
    return {OPENAI_CHAT: chat_wire, ANTHROPIC: anthropic_wire}[dialect].build_answer(ans, conv)


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


# ---- streaming a Generation -----------------------------------------------------------------------------------
def stream(dialect: str, deltas: Iterable[str], finish: Callable[[], tuple[Generation, str]], model: str,
           rid: str, created: int, prompt_tokens: int = 0, tool_use: ToolUse | None = None,
           conv: Conversation | None = None) -> Iterator[bytes]:
    """Server-sent events for a generation. `finish()` runs after the last delta: it returns the Generation and
    the receipt of its record (written durably by then), which rides in the final event. With tools, text is held
    back while it may be the start of a `<tool_call>`, and a call is streamed once it is complete and parses."""
    return _stream(dialect, _parts(deltas, tool_use), finish, model, rid, created, prompt_tokens, tool_use,
                   conv or NO_CONVERSATION)


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


def _events(dialect: str, parts, rid: str, tool_use: ToolUse | None, ended: Callable[[], None]):
    """A generation's parts as the neutral stream's blocks: text blocks around calls (chat: one content, a segment
    after a call starting with a newline, as the rendered answer joins them), each call's arguments in pieces.
    Without tools the text block opens at once, as it always did; an answer with nothing in it is one empty text.
    `ended()` runs as soon as the last part is read, before anything more is sent: the generation is recorded then,
    whether or not the client is still there for the stream's last events."""
    index, text_open, texted, separate = -1, False, False, False
    if tool_use is None:
        index, text_open = 0, True
        yield BlockStart(0, Text(""))
    for part in parts:
        if isinstance(part, str):
            if not text_open:
                index, text_open = index + 1, True
                yield BlockStart(index, Text(""))
            joined = "\n" if dialect == OPENAI_CHAT and separate else ""
            yield Delta(index, joined + part)
            texted, separate = True, False
            continue
        if text_open:
            yield BlockStop(index)
        index, text_open = index + 1, False
        yield BlockStart(index, _wire_call(dialect, rid, part))  # whole: a local shell call is sent with its start
        for piece in _pieces(part.arguments_json()):
            yield Delta(index, piece)
        yield BlockStop(index)
        separate = texted
    ended()
    if index < 0:
        index, text_open = 0, True
        yield BlockStart(0, Text(""))
    if text_open:
        yield BlockStop(index)


def _stream(dialect, parts, finish, model, rid, created, prompt_tokens, tool_use, conv):
    """The stream through the dialect's writer (translate/); the receipt rides on its last event (chat: the usage
    chunk before `[DONE]`; Anthropic: `message_stop`; Responses: `response.completed`)."""
    writer = _writer(dialect, conv, rid)
    writer.created = created
    for name, obj in writer.write(Start(rid, model, Usage(input=prompt_tokens))):
        yield sse(obj, name)
    done: list = []
    for ev in _events(dialect, parts, rid, tool_use, lambda: done.extend(finish())):
        for name, obj in writer.write(ev):
            yield sse(obj, name)
    gen, receipt = done
    ans = neutral_answer(dialect, gen, model, rid, created, tool_use)
    for name, obj in writer.write(Finish(ans.stop, ans.stop_sequence, ans.usage)):
        yield sse(obj, name)
    reef = {"agent_record_id": receipt, "release_id": gen.release_id}
    for name, obj in writer.close():
        yield b"data: [DONE]\n\n" if obj == "[DONE]" else sse({**obj, "reef": reef}, name)
