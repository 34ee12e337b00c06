"""A recorded call of any dialect as text: what learners, the harness's change requests and the apps read of a
record's request and response. Read through the dialects' own readers (translate/: one reader per dialect), never
a reading of their own, so a dialect's shape is known in one place.

A record's dialect is the one its client spoke (records of the gateway always name it); an imported record may
leave it empty, and then the request's and answer's shape decide (`dialect_of`). A request the reader refuses (a
record of a refused call, an imported oddity) reads as nothing rather than failing the page or the learner that
shows it: `lines` says so in one line.
"""

from __future__ import annotations

import orjson

from reef_lab.errors import BadRequest
from reef_lab.wire import ANTHROPIC, DIALECTS, OPENAI_CHAT, OPENAI_RESPONSES
from reef_lab.wire.translate import MODULES
from reef_lab.wire.translate.ir import Answer, Conversation, Image, Text, Thinking, ToolCall, ToolResult

# Server-side state and sampling counts say nothing about a recorded conversation's text; the relay's readers
# refuse them (they cannot be translated), so they are left out before reading a record.
_STATE_KEYS = ("previous_response_id", "conversation", "n")


def json_value(value):
    """A stored JSON field as its value: JSON text parsed (a record read from Parquet keeps it as text), else as is."""
    if isinstance(value, (str, bytes)) and value:
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def dialect_of(dialect: str | None, request=None, response=None) -> str:
    """The record's dialect, or (empty, as an imported record may leave it) the one its shapes are written in."""
    if dialect in DIALECTS:
        return dialect
    req, resp = json_value(request), json_value(response)
    req = req if isinstance(req, dict) else {}
    resp = resp if isinstance(resp, dict) else {}
    if "input" in req or "instructions" in req or "output" in resp:
        return OPENAI_RESPONSES
    if "choices" in resp:
        return OPENAI_CHAT
    if "system" in req or resp.get("type") == "message" or isinstance(resp.get("content"), list):
        return ANTHROPIC
    return OPENAI_CHAT


def conversation(dialect: str | None, request) -> Conversation:
    """The request in the neutral form; raises BadRequest (naming the field) when the dialect's reader refuses it."""
    req = json_value(request)
    if not isinstance(req, dict):
        raise BadRequest("the recorded request is not a JSON object")
    req = {k: v for k, v in req.items() if k not in _STATE_KEYS}
    return MODULES[dialect_of(dialect, req)].parse_request(req)


def answer(dialect: str | None, response) -> Answer | None:
    """The recorded answer in the neutral form; None when there is none (a refused or failed call)."""
    resp = json_value(response)
    if not isinstance(resp, dict) or not any(k in resp for k in ("choices", "output", "content")):
        return None
    try:
        return MODULES[dialect_of(dialect, None, resp)].parse_answer(resp)
    except (AttributeError, TypeError, KeyError):  # a part that is not an object: the answer is not this dialect's
        return None


def _arguments(text: str) -> str:
    """A call's arguments as compact JSON (each dialect spaces them its own way), or as sent when not JSON."""
    try:
        return orjson.dumps(orjson.loads(text)).decode()
    except orjson.JSONDecodeError:
        return text


def call_text(call: ToolCall) -> str:
    return f"{call.name}({_arguments(call.arguments)})"


def _content(parts: list) -> str:
    """Text parts joined as the model reads them; an image as [image]."""
    return "".join(p.text if isinstance(p, Text) else "[image]" for p in parts if isinstance(p, (Text, Image)))


def lines(dialect: str | None, request) -> list[dict]:
    """The request as {role, text, call} lines, in order: role system, user, assistant or tool; `call` is a tool
    call as `name(arguments)` (assistant) or the id of the call a tool result answers (tool)."""
    try:
        conv = conversation(dialect, request)
    except BadRequest as e:
        return [{"role": "system", "text": f"(the request is not readable as {dialect_of(dialect, request)}: {e})",
                 "call": None}]
    out = [{"role": "system", "text": s, "call": None} for s in conv.system]
    for turn in conv.turns:
        shown = [p for p in turn.parts if isinstance(p, (Text, Image))]
        if shown or not any(isinstance(p, (ToolCall, ToolResult, Thinking)) for p in turn.parts):
            out.append({"role": turn.role, "text": _content(shown), "call": None})
        for p in turn.parts:
            if isinstance(p, ToolCall):
                out.append({"role": "assistant", "text": "", "call": call_text(p)})
            elif isinstance(p, ToolResult):
                out.append({"role": "tool", "text": _content(p.content), "call": p.call_id})
    return out


def request_messages(dialect: str | None, request) -> list[dict]:
    """The client's conversation as plain {role, content: str} user and assistant messages, without system text or
    tool results (what GEPA's reflection and a change request show of a call)."""
    try:
        conv = conversation(dialect, request)
    except BadRequest:
        return []
    return [{"role": t.role, "content": "".join(p.text for p in t.parts if isinstance(p, Text))}
            for t in conv.turns if t.role in ("user", "assistant")
            and not (t.parts and all(isinstance(p, ToolResult) for p in t.parts))]


def last_user_text(dialect: str | None, request) -> str:
    """The text of the request's last user message that holds text."""
    users = [m for m in lines(dialect, request) if m["role"] == "user" and m["text"]]
    return users[-1]["text"] if users else ""


def response_text(dialect: str | None, response) -> str:
    """The answer's text (no thinking, no calls); "" when there is none."""
    ans = answer(dialect, response)
    return "" if ans is None else "".join(p.text for p in ans.parts if isinstance(p, Text))


def response_calls(dialect: str | None, response) -> list[str]:
    """The answer's tool calls as `name(arguments)`."""
    ans = answer(dialect, response)
    return [] if ans is None else [call_text(p) for p in ans.parts if isinstance(p, ToolCall)]


def chat_message(record: dict) -> dict:
    """The assistant message of a call the gateway answered in OpenAI chat shape (what a task's tool loop and the
    releaser read back from a record of their own request): content and, when it called tools, tool_calls; keys
    whose value is null left out."""
    if record.get("dialect") not in (OPENAI_CHAT, ""):
        raise ValueError(f"chat_message reads OpenAI chat records; this one is {record.get('dialect')!r}")
    choices = (record.get("response") or {}).get("choices") or []
    if not choices:
        raise ValueError(f"record {record.get('id')} holds no answer ({record.get('status')}: {record.get('error')})")
    return {k: v for k, v in (choices[0].get("message") or {}).items() if v is not None}
