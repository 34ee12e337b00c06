"""The checks the dialects' readers (translate/) apply to tool fields when they read a request for an engine here.

OpenAI chat (`tools` of `{"type": "function", "function": {...}}`, `tool_choice`, assistant `tool_calls`,
`role: tool` messages), OpenAI Responses (`tool_choice` here; its tools that are not plain functions in
responses_tools.py) and Anthropic messages (`tools` with `input_schema`, `tool_choice`, `tool_use` and
`tool_result` blocks): a tool is a function schema an engine's template takes, a call names an id and a function,
a result answers an earlier call, and every refusal is a 400 naming the field. dialects.py makes the engine's
ToolUse (reef_lab/engines/tools.py); answers.py renders calls back in each dialect.
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
    malformed or is not a function (a Responses request's tools: the Responses reader)."""
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


def choice_of(body: dict, dialect: str) -> tuple[str | dict, bool]:
    """The request's tool choice in the neutral form (auto | none | required | {"name": ...}) and whether parallel
    calls are allowed, from the dialect's own fields; a 400 naming the field when malformed or when it forces a tool
    an engine cannot run."""
    tc = body.get("tool_choice")
    if dialect == ANTHROPIC:
        if tc is None:
            return "auto", True
        if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
            raise BadRequest("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"} (with "
                             "\"name\" for \"tool\")")
        off = tc.get("disable_parallel_tool_use")
        if off is not None and not isinstance(off, bool):
            raise BadRequest("'tool_choice.disable_parallel_tool_use' must be a boolean")
        if tc["type"] == "tool":
            if not isinstance(tc.get("name"), str):
                raise BadRequest("'tool_choice.name' must name a tool when the type is \"tool\"")
            return {"name": tc["name"]}, not off
        return {"any": "required"}.get(tc["type"], tc["type"]), not off
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise BadRequest("'parallel_tool_calls' must be a boolean")
    parallel = parallel is not False
    if tc is None:
        return "auto", parallel
    if tc in ("none", "auto", "required"):
        return tc, parallel
    if isinstance(tc, dict) and tc.get("type") == "function":
        fn = tc.get("function") if dialect == OPENAI_CHAT else tc
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str):
            return {"name": name}, parallel
    if dialect == OPENAI_RESPONSES and isinstance(tc, dict) and tc.get("type") == "custom" and isinstance(
            tc.get("name"), str):
        return {"name": tc["name"]}, parallel  # a custom tool is offered to the model as a function
    if dialect == OPENAI_RESPONSES and isinstance(tc, dict) and isinstance(tc.get("type"), str) and tc["type"] not in (
            "function", "custom", "allowed_tools"):
        raise BadRequest(f"'tool_choice' forces a {tc['type']!r} tool, which this engine cannot run (hosted tools are "
                         "left out: docs/tools.md); use 'auto', 'none', 'required' or a function or custom tool by "
                         "name")
    shape = ('{"type": "function", "function": {"name": ...}}' if dialect == OPENAI_CHAT
             else '{"type": "function", "name": ...}')
    raise BadRequest(f"'tool_choice' must be 'none', 'auto', 'required' or {shape}")


def tool_use(functions: list[dict], choice: str | dict | None, parallel: bool | None,
             wire: dict[str, dict] | None = None) -> ToolUse | None:
    """The tools a request offers and its tool choice, as an engine takes them; None when it offers none."""
    seen: set[str] = set()
    for t in functions:
        if t["function"]["name"] in seen:
            raise BadRequest(f"'tools' names function {t['function']['name']!r} more than once")
        seen.add(t["function"]["name"])
    name = choice["name"] if isinstance(choice, dict) else None
    kind = "function" if name is not None else (choice or "auto")
    if not functions:
        if kind in ("required", "function"):
            raise BadRequest("'tool_choice' asks for a tool call but the request has no 'tools'")
        return None
    if name is not None and name not in seen:
        known = ", ".join(t["function"]["name"] for t in functions)
        raise BadRequest(f"'tool_choice' names function {name!r}, which is not among 'tools' ({known})")
    return ToolUse(functions, kind, name, parallel is not False, dict(wire or {}))


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


def call(where: str, call_id, name, calls: set[str], id_key: str = "id") -> None:
    """Checks a call's id and name for an engine, and notes the id (a later tool result must answer it)."""
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest(f"{where}.{id_key} must be a non-empty string")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be the called function's name")
    calls.add(call_id)


def answers(call_id, calls: set[str], where: str) -> None:
    """A tool result must answer a call of an earlier assistant turn (an engine's template pairs them)."""
    if not isinstance(call_id, str) or call_id not in calls:
        raise BadRequest(f"{where} {_shown(call_id)} answers no tool call of an earlier assistant turn")


def chat_call(tc, where: str, calls: set[str]) -> tuple[str, str, dict]:
    """An OpenAI chat assistant message's tool call, checked: (id, name, arguments)."""
    if not isinstance(tc, dict) or tc.get("type", "function") != "function" or not isinstance(tc.get("function"), dict):
        raise BadRequest(f"{where} must be {{id, type: \"function\", function: {{name, arguments}}}}")
    fn = tc["function"]
    args = arguments_of(fn.get("arguments"), f"{where}.function.arguments")
    call(where, tc.get("id"), fn.get("name"), calls)
    return tc["id"], fn["name"], args
