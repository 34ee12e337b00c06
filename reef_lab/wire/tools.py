"""The tool parts of the three dialects' requests, read into one form for the engines that generate.

OpenAI chat (`tools` of `{"type": "function", "function": {...}}`, `tool_choice`, assistant `tool_calls`,
`role: tool` messages), OpenAI Responses (`tool_choice` here; its tools and tool items in responses_tools.py, which
maps the kinds that are not plain functions) and Anthropic messages (`tools` with `input_schema`, `tool_choice`,
`tool_use` and `tool_result` blocks) all become a ToolUse (reef_lab/engines/tools.py) and messages as transformers'
chat templates take them: an assistant message with `tool_calls` [{"id", "type": "function", "function": {"name",
"arguments": dict}}] and `tool` messages with `tool_call_id`, `name` and text `content`. Every refusal is a 400
naming the field. The answers (calls rendered in each dialect) are in answers.py.
"""

from __future__ import annotations

import json
import re

from reef_lab.engines.tools import ToolUse
from reef_lab.errors import BadRequest
from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def _shown(value) -> str:
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:60] + "..."


# ---- tools and tool_choice ------------------------------------------------------------------------------------
def function_schema(name, description, schema, where: str, schema_key: str) -> dict:
    """One function tool as transformers' templates take it; a 400 naming the field when it is malformed."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BadRequest(f"{where}.name must be 1-128 letters, digits, '_', '-', '.' or ':', got {_shown(name)}")
    fn: dict = {"name": name}
    if description is not None:
        if not isinstance(description, str):
            raise BadRequest(f"{where}.description must be a string")
        fn["description"] = description
    if schema is None and schema_key == "parameters":
        schema = EMPTY_SCHEMA
    if not isinstance(schema, dict):
        raise BadRequest(f"{where}.{schema_key} must be a JSON Schema object, got {_shown(schema)}")
    fn["parameters"] = schema
    return {"type": "function", "function": fn}


def read_tools(body: dict, dialect: str) -> list[dict]:
    """An OpenAI chat or Anthropic request's `tools` as OpenAI function schemas; 400 naming the field when one is
    malformed (a Responses request's: responses_tools.read_tools)."""
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tool objects")
    out = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"{where} must be an object")
        if dialect == ANTHROPIC:
            if t.get("type") not in (None, "custom"):
                raise BadRequest(f"{where}.type {_shown(t.get('type'))} is a server tool, which this engine does not "
                                 "run: send client tools {name, description, input_schema}")
            out.append(function_schema(t.get("name"), t.get("description"), t.get("input_schema"), where,
                                       "input_schema"))
            continue
        if t.get("type") != "function":
            raise BadRequest(f"{where}.type must be 'function' (the only tools this engine's model calls), got "
                             f"{_shown(t.get('type'))}")
        if t.get("strict") is not None and not isinstance(t.get("strict"), bool):
            raise BadRequest(f"{where}.strict must be a boolean")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise BadRequest(f"{where}.function must be an object {{name, description?, parameters?}}")
        out.append(function_schema(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{where}.function",
                                   "parameters"))
    return out


def _choice(body: dict, dialect: str) -> tuple[str, str | None, bool]:
    """(choice, named function, parallel calls allowed) from the dialect's own fields."""
    tc = body.get("tool_choice")
    if dialect == ANTHROPIC:
        if tc is None:
            return "auto", None, True
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            raise BadRequest("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"} (with "
                             "\"name\" for \"tool\")")
        off = tc.get("disable_parallel_tool_use")
        if off is not None and not isinstance(off, bool):
            raise BadRequest("'tool_choice.disable_parallel_tool_use' must be a boolean")
        kind = {"any": "required", "tool": "function"}.get(tc["type"], tc["type"])
        name = tc.get("name") if kind == "function" else None
        if kind == "function" and not isinstance(name, str):
            raise BadRequest("'tool_choice.name' must name a tool when the type is \"tool\"")
        return kind, name, not off
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("'parallel_tool_calls' must be a boolean")
    parallel = parallel is not False
    if tc is None:
        return "auto", None, parallel
    if tc in ("none", "auto", "required"):
        return tc, None, parallel
    if isinstance(tc, dict) and tc.get("type") == "function":
        fn = tc.get("function") if dialect == OPENAI_CHAT else tc
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            return "function", name, parallel
    if dialect == OPENAI_RESPONSES and isinstance(tc, dict) and tc.get("type") == "custom" and isinstance(
            tc.get("name"), str):
        return "function", tc["name"], parallel  # a custom tool is offered to the model as a function
    if dialect == OPENAI_RESPONSES and isinstance(tc, dict) and isinstance(tc.get("type"), str) and tc["type"] not in (
            "function", "custom", "allowed_tools"):
        raise BadRequest(f"'tool_choice' forces a {tc['type']!r} tool, which this engine cannot run (hosted tools are "
                         "left out: docs/tools.md); use 'auto', 'none', 'required' or a function or custom tool by "
                         "name")
    shape = ('{"type": "function", "function": {"name": ...}}' if dialect == OPENAI_CHAT
             else '{"type": "function", "name": ...}')
    raise BadRequest(f"'tool_choice' must be 'none', 'auto', 'required' or {shape}")


def read_tool_use(body: dict, dialect: str, functions: list[dict] | None = None,
                  wire: dict[str, dict] | None = None) -> ToolUse | None:
    """The tools a request offers and its tool choice; None when it offers none. `functions` and `wire`: a Responses
    request's tools as responses_tools.read_tools gives them (the others' are read here)."""
    tools = read_tools(body, dialect) if functions is None else functions
    seen: set[str] = set()
    for t in tools:
        if t["function"]["name"] in seen:
            raise BadRequest(f"'tools' names function {t['function']['name']!r} more than once")
        seen.add(t["function"]["name"])
    choice, name, parallel = _choice(body, dialect)
    if not tools:
        if choice in ("required", "function"):
            raise BadRequest("'tool_choice' asks for a tool call but the request has no 'tools'")
        return None
    if name is not None and name not in {t["function"]["name"] for t in tools}:
        known = ", ".join(t["function"]["name"] for t in tools)
        raise BadRequest(f"'tool_choice' names function {name!r}, which is not among 'tools' ({known})")
    return ToolUse(tools, choice, name, parallel, dict(wire or {}))


# ---- tool calls and results in the history --------------------------------------------------------------------
def arguments_of(value, where: str) -> dict:
    """A call's arguments from the wire: a JSON object, or (OpenAI) a string of one ("" for none)."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise BadRequest(f"{where} must be a JSON object (as a string): {e.msg} at character {e.pos}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be a JSON object, got {_shown(value)}")
    return value


class History:
    """Messages read so far, and the tool calls they made (so a tool result must answer a call made earlier)."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.calls: dict[str, str] = {}  # call id -> function name

    def call(self, where: str, call_id, name, arguments: dict, id_key: str = "id") -> dict:
        if not isinstance(call_id, str) or not call_id:
            raise BadRequest(f"{where}.{id_key} must be a non-empty string")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"{where}.name must be the called function's name")
        self.calls[call_id] = name
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}

    def assistant(self, content: str, calls: list[dict], join: bool = False) -> None:
        """An assistant turn; with `join`, calls go onto the assistant message just before when there is one."""
        last = self.messages[-1] if self.messages else None
        if join and last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).extend(calls)
            return
        msg: dict = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        self.messages.append(msg)

    def result(self, where: str, call_id, content: str) -> None:
        if not isinstance(call_id, str) or call_id not in self.calls:
            raise BadRequest(f"{where} {_shown(call_id)} answers no tool call of an earlier assistant turn")
        self.messages.append({"role": "tool", "tool_call_id": call_id, "name": self.calls[call_id],
                              "content": content})


def chat_tool_calls(h: History, m: dict, where: str) -> list[dict]:
    """An OpenAI chat assistant message's `tool_calls`."""
    tcs = m.get("tool_calls")
    if tcs is None:
        return []
    if not isinstance(tcs, list):
        raise BadRequest(f"{where}.tool_calls must be a list")
    out = []
    for j, tc in enumerate(tcs):
        w = f"{where}.tool_calls[{j}]"
        if not isinstance(tc, dict) or tc.get("type", "function") != "function" or not isinstance(
                tc.get("function"), dict):
            raise BadRequest(f"{w} must be {{id, type: \"function\", function: {{name, arguments}}}}")
        fn = tc["function"]
        out.append(h.call(w, tc.get("id"), fn.get("name"), arguments_of(fn.get("arguments"), f"{w}.function.arguments")))
    return out


def anthropic_blocks(h: History, role: str, blocks: list, where: str, text_of) -> None:
    """An Anthropic message whose content holds tool_use (assistant) or tool_result (user) blocks. `text_of` reads
    text blocks (and refuses others)."""
    texts, calls = [], []
    for j, b in enumerate(blocks):
        w = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("input"), dict):
                raise BadRequest(f"{w}.input must be an object")
            calls.append(h.call(w, b.get("id"), b.get("name"), b["input"]))
        elif kind == "tool_result" and role == "user":
            content = text_of(b.get("content"), f"{w}.content")
            if b.get("is_error") is True:
                content = "Error: " + content
            h.result(f"{w}.tool_use_id", b.get("tool_use_id"), content)
        elif kind in ("tool_use", "tool_result"):
            raise BadRequest(f"{w}: a {kind} block belongs in {'an assistant' if kind == 'tool_use' else 'a user'} "
                             "message")
        else:
            texts.append(text_of([b], w))
    text = "".join(texts)
    if role == "assistant":
        h.assistant(text, calls)
    elif text:
        h.messages.append({"role": "user", "content": text})
