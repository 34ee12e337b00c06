"""The OpenAI Responses API's tools that are not plain functions, for the engines that generate (embedded, vLLM,
SGLang), read from a request and written back into the answer: the one place that maps them.

A model served here writes every call as a function call (`<tool_call>` JSON, reef_lab/engines/tools.py), so the
tools a Responses client offers reach it as function schemas, and its calls go back as the items the client asked for:

- `custom` (freeform) tools, e.g. Codex's `apply_patch`: a function of one string argument, `input` (the tool's
  grammar, when it has one, in that argument's description); a call comes back as `custom_tool_call {input}`;
- `local_shell`: a function `local_shell` whose arguments are the documented exec action (`command` list of strings,
  `env`, `timeout_ms`, `working_directory`, `user`); a call comes back as `local_shell_call {action}`;
- `namespace` tools (Codex's MCP and multi-agent groups): each function or custom tool inside as
  `<namespace>__<name>`; a call comes back as the item with its `namespace` and own name (the relay's convention,
  reef_lab/wire/translate/responses.py);
- every other kind (`web_search`, `file_search`, `tool_search`, `code_interpreter`, `image_generation`, `mcp`,
  `computer_use_preview`, ...) is a tool the provider runs, which an engine here cannot: it is left out of what the
  model sees and listed in the record's `metadata.dropped`.

The history's `custom_tool_call` and `local_shell_call` items (and their `*_output`s) are read back (by the Responses
reader, translate/responses.py) into function calls with the same arguments, so a conversation's next prompt shows
each call as the model wrote it.
docs/tools.md, "Hosted and freeform tools (Codex CLI)".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from reef_lab.errors import BadRequest
from reef_lab.wire.tools import function_schema

NS = "__"  # a namespaced tool's function name: <namespace>__<name>
CUSTOM_INPUT = "input"  # the one argument of a custom tool's function
LOCAL_SHELL = "local_shell"
LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"},
                    "description": "The command to run, as a list of arguments, e.g. [\"bash\", \"-lc\", \"ls\"]."},
        "working_directory": {"type": "string", "description": "The folder to run it in."},
        "timeout_ms": {"type": "integer", "description": "How long it may run, in milliseconds."},
        "env": {"type": "object", "additionalProperties": {"type": "string"},
                "description": "Environment variables to set for the command."},
        "user": {"type": "string", "description": "The user to run it as."}},
    "required": ["command"]}
_ACTION_KEYS = ("timeout_ms", "working_directory", "user")


def custom_parameters(fmt) -> dict:
    """A custom tool's function schema: one string, `input`, described by the tool's grammar when it has one."""
    text = "The tool's input, as free text (not JSON)."
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(fmt.get("definition"), str):
        text += f" It must match this {fmt.get('syntax', '')} grammar:\n{fmt['definition']}"
    return {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string", "description": text}},
            "required": [CUSTOM_INPUT]}


# ---- requests ---------------------------------------------------------------------------------------------------
@dataclass
class Offered:
    """A request's tools as the model sees them: function schemas, the client's own form of each one that is not a
    plain function (`ToolUse.wire`), and the tools left out (with where they were in the request)."""

    functions: list[dict] = field(default_factory=list)
    wire: dict[str, dict] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)


def read_tools(body: dict) -> Offered:
    """The request's `tools`; a malformed one is a 400 naming it (a function's checks: tools.function_schema)."""
    tools = body.get("tools")
    out = Offered()
    if tools is None:
        return out
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list of tool objects")
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise BadRequest(f"{where} must be an object")
        kind = t.get("type")
        if kind == "namespace":
            ns, inner = t.get("name"), t.get("tools")
            if not isinstance(ns, str) or not ns or not isinstance(inner, list):
                raise BadRequest(f"{where}: a namespace tool needs a 'name' and a list of 'tools'")
            for j, sub in enumerate(inner):
                _read_tool(sub, f"{where}.tools[{j}]", ns, out)
        else:
            _read_tool(t, where, None, out)
    return out


def _read_tool(t, where: str, ns: str | None, out: Offered) -> None:
    if not isinstance(t, dict):
        raise BadRequest(f"{where} must be an object")
    kind = t.get("type")
    if t.get("strict") is not None and not isinstance(t.get("strict"), bool):
        raise BadRequest(f"{where}.strict must be a boolean")
    if kind == LOCAL_SHELL and ns is None:
        out.functions.append(function_schema(LOCAL_SHELL, "Run a command on the user's machine and see its output.",
                                              LOCAL_SHELL_PARAMETERS, where, "parameters"))
        out.wire[LOCAL_SHELL] = {"type": LOCAL_SHELL}
        return
    if kind not in ("function", "custom"):
        out.dropped.append(f"{where} ({kind}: a hosted tool, which this engine cannot run)")
        return
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be the tool's name")
    flat = f"{ns}{NS}{name}" if ns else name
    params = custom_parameters(t.get("format")) if kind == "custom" else t.get("parameters")
    out.functions.append(function_schema(flat, t.get("description"), params, where, "parameters"))
    if kind == "custom" or ns:
        out.wire[flat] = {"type": kind, "name": name, **({"namespace": ns} if ns else {})}


def action_arguments(action, where: str) -> dict:
    """A `local_shell_call`'s exec action as the function arguments the model wrote (the inverse of `_action`)."""
    if not isinstance(action, dict) or action.get("type") != "exec" or not isinstance(action.get("command"), list):
        raise BadRequest(f"{where}.action must be {{\"type\": \"exec\", \"command\": [...], ...}}")
    args = {"command": action["command"]}
    if action.get("env"):
        args["env"] = action["env"]
    args.update({k: action[k] for k in _ACTION_KEYS if action.get(k) is not None})
    return args


# ---- answers ----------------------------------------------------------------------------------------------------
def custom_input(arguments: dict) -> str:
    """What a custom tool gets: the model's `input` string (the arguments' JSON when it wrote something else, so
    the client's own check reports it to the model, as with a function's arguments)."""
    text = arguments.get(CUSTOM_INPUT)
    return text if isinstance(text, str) and len(arguments) == 1 else json.dumps(arguments, ensure_ascii=False)


def shell_action(arguments: dict) -> dict:
    """The exec action of a local shell call: the model's arguments as written (the client checks them, as it
    checks a function's), with the documented `type` and `env` always there."""
    return {"type": "exec", "command": arguments.get("command"), "env": arguments.get("env") or {},
            **{k: arguments.get(k) for k in _ACTION_KEYS}}
