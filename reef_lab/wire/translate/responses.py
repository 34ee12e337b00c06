"""OpenAI Responses (https://platform.openai.com/docs/api-reference/responses) read into and written from the neutral
form. Translation is stateless: `previous_response_id` is refused, and requests sent to a Responses provider carry
`store: false` (a chat or Anthropic client never asked the provider to keep its conversation). A namespace tool's
functions travel as `<namespace>__<name>` and come back split; a custom (freeform) tool travels as a function of
one string argument, `input`, and comes back as a `custom_tool_call`."""

from __future__ import annotations

import time
from typing import Callable

from reef_lab.wire import OPENAI_RESPONSES, responses_tools, tools
from reef_lab.wire.responses_tools import NS  # <namespace>__<name>, as the engines' side writes it
from reef_lab.wire.translate.common import (arguments_object, as_dict, as_list, bounded, engine_text, image_url,
                                               json_text, need, new_id, number)
from reef_lab.wire.translate.ir import (Answer, Conversation, Image, Text, Thinking, Tool, ToolCall, ToolResult,
                                           Turn, Usage)

_HINTS = {"store", "include", "metadata", "prompt_cache_key", "client_metadata", "service_tier", "truncation",
          "user", "safety_identifier", "text", "background", "top_logprobs", "stream_options"}


# ---- requests ---------------------------------------------------------------------------------------------------
def _parts(content, where: str) -> list:
    if isinstance(content, str):
        return [Text(content)]
    if content is None:
        return []
    out = []
    for j, p in enumerate(as_list(content, f"{where}.content")):
        w = f"{where}.content[{j}]"
        if isinstance(p, str):
            out.append(Text(p))
            continue
        kind = as_dict(p, w).get("type")
        if kind in ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"):
            text = p.get("text", p.get("refusal"))
            need(isinstance(text, str), f"{w} needs a string 'text'")
            out.append(Text(text))
        elif kind == "input_image":
            need(isinstance(p.get("image_url"), str), f"{w}: an image must come as image_url (file_id needs the "
                                                      "provider's own file store)")
            out.append(image_url(p["image_url"], w))
        else:
            need(False, f"{w}: content of type {kind!r} cannot be translated to another provider's API")
    return out


def _assistant(conv: Conversation, message: bool = False) -> Turn:
    """The assistant turn a call (or, with `message`, an assistant message) joins: the last turn when it is the
    assistant's (a message only after reasoning alone), else a new one. Two assistant messages stay two turns."""
    last = conv.turns[-1] if conv.turns else None
    if last is None or last.role != "assistant" or (message and not all(isinstance(p, Thinking) for p in last.parts)):
        conv.turns.append(Turn("assistant", []))
    return conv.turns[-1]


def _results(conv: Conversation) -> Turn:
    last = conv.turns[-1] if conv.turns else None
    if last is None or last.role != "user" or not all(isinstance(p, ToolResult) for p in last.parts):
        conv.turns.append(Turn("user", []))
    return conv.turns[-1]


def _call_id(item: dict, where: str, fallback: bool = False) -> str:
    """An item's `call_id` (a local shell item may name its call by `id` alone, as the API documents it)."""
    cid = item.get("call_id")
    if cid is None and fallback:
        cid = item.get("id")
    need(isinstance(cid, str) and bool(cid), f"{where}.call_id must be a non-empty string")
    return cid


def _engine_item(conv: Conversation, kind: str, item: dict, w: str, calls: set[str]) -> None:
    """A tool call or output item, read for an engine here: checked, local shell calls kept (as the function the
    model was offered), anything else a 400."""
    if kind in ("function_call", "custom_tool_call"):
        name = item.get("name")
        if isinstance(name, str) and isinstance(item.get("namespace"), str):
            name = f"{item['namespace']}{NS}{name}"
        if kind == "function_call":
            args = json_text(tools.arguments_of(item.get("arguments"), f"{w}.arguments"))
        else:
            need(isinstance(item.get("input"), str), f"{w}.input must be a string (a custom tool's input)")
            args = item["input"]
        tools.call(w, item.get("call_id"), name, calls, "call_id")
        _assistant(conv).parts.append(ToolCall(item["call_id"], name, args, kind == "custom_tool_call"))
    elif kind == "local_shell_call":
        args = responses_tools.action_arguments(item.get("action"), w)
        cid = _call_id(item, w, True)
        tools.call(w, cid, responses_tools.LOCAL_SHELL, calls, "call_id")
        _assistant(conv).parts.append(ToolCall(cid, responses_tools.LOCAL_SHELL, json_text(args), local_shell=True))
    elif kind in ("function_call_output", "custom_tool_call_output", "local_shell_call_output"):
        cid = _call_id(item, w, fallback=kind == "local_shell_call_output")
        tools.answers(cid, calls, f"{w}.call_id")
        _results(conv).parts.append(ToolResult(cid, [engine_text(item.get("output"), f"{w}.output")]))
    else:
        need(False, f"{w}: an item of type {kind!r} is not supported by this engine (only messages, and the calls "
                    "and outputs of function, custom and local_shell tools)")


def parse_request(body: dict, strict: bool = False) -> Conversation:
    """The request in the neutral form. `strict`: read for an engine here (text only; local_shell tools and calls
    kept as functions; reasoning and hosted tools' items refused; the engines' sampling limits), not for a relay."""
    need(isinstance(body, dict), "the request body must be a JSON object")
    need(body.get("previous_response_id") is None and body.get("conversation") is None,
         "'previous_response_id' and 'conversation' name state kept by an OpenAI server; reef_lab keeps none: send "
         "the whole conversation in 'input'")
    conv = Conversation(system=[], turns=[], model=body.get("model"), stream=bool(body.get("stream")))
    if strict:
        offered = responses_tools.read_tools(body)
        for fn in (f["function"] for f in offered.functions):
            wire = offered.wire.get(fn["name"], {})
            conv.tools.append(Tool(fn["name"], fn.get("description"), fn["parameters"], custom=wire.get("type") ==
                                   "custom", local_shell=wire.get("type") == responses_tools.LOCAL_SHELL))
            if "namespace" in wire:
                conv.namespaces[fn["name"]] = (wire["namespace"], wire["name"])
        conv.dropped += offered.dropped
        conv.tool_choice, conv.parallel_tool_calls = tools.choice_of(body, OPENAI_RESPONSES)
    if body.get("instructions") is not None:
        need(isinstance(body["instructions"], str), "'instructions' must be a string")
        conv.system.append(body["instructions"])
    inp = body.get("input")
    need(isinstance(inp, str) or (isinstance(inp, list) and bool(inp)),
         "'input' must be a string or a non-empty list of input items")
    items = [{"type": "message", "role": "user", "content": inp}] if isinstance(inp, str) else inp
    calls: set[str] = set()
    for i, item in enumerate(items):
        w = f"input[{i}]"
        kind = as_dict(item, w).get("type", "message")
        if kind == "message":
            role = item.get("role")
            need(role in ("system", "developer", "user", "assistant"),
                 f"{w}.role must be one of system, developer, user, assistant")
            parts = [engine_text(item.get("content"), w)] if strict else _parts(item.get("content"), w)
            if role in ("system", "developer"):
                text = "".join(p.text for p in parts if isinstance(p, Text))
                conv.turns.append(Turn("system", [Text(text)])) if conv.turns else conv.system.append(text)
            elif role == "assistant":
                _assistant(conv, message=True).parts += parts
            else:
                conv.turns.append(Turn("user", parts))
        elif kind == "item_reference":
            need(False, f"{w}: an item_reference names an item kept by an OpenAI server; send the item itself")
        elif strict:
            _engine_item(conv, kind, item, w, calls)
        elif kind in ("function_call", "custom_tool_call"):
            need(isinstance(item.get("call_id"), str) and isinstance(item.get("name"), str),
                 f"{w} needs a call_id and a name")
            name = f"{item['namespace']}{NS}{item['name']}" if item.get("namespace") else item["name"]
            custom = kind == "custom_tool_call"
            args = item.get("input" if custom else "arguments")
            _assistant(conv).parts.append(ToolCall(item["call_id"], name, args if isinstance(args, str) else "",
                                                   custom))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            need(isinstance(item.get("call_id"), str), f"{w} needs a call_id")
            out = item.get("output")
            parts = [Text(out)] if isinstance(out, str) else _parts(out or [], w)
            _results(conv).parts.append(ToolResult(item["call_id"], parts))
        elif kind == "reasoning":
            texts = [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)] or \
                [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
            _assistant(conv).parts.append(Thinking("\n\n".join(texts), item.get("encrypted_content")))
        else:  # hosted tools' records (web search, file search, local shell, ...): nothing another provider can replay
            conv.dropped.append(f"{w} ({kind})")
    if strict:
        conv.max_tokens = bounded(body, "max_output_tokens", 1, 32768, integer=True)
        conv.temperature, conv.top_p = bounded(body, "temperature", 0, 2), bounded(body, "top_p", 0, 1)
        conv.seed = bounded(body, "seed", -2**63, 2**63 - 1, integer=True)
        return conv
    tools_in = body.get("tools") or []
    need(isinstance(tools_in, list), "'tools' must be a list of tool objects")
    for i, t in enumerate(tools_in):
        w = f"tools[{i}]"
        kind = as_dict(t, w).get("type")
        if kind == "namespace":
            for j, inner in enumerate(as_list(t.get("tools"), f"{w}.tools")):
                tool = _tool(inner, f"{w}.tools[{j}]", conv)
                if tool is not None:
                    conv.namespaces[f"{t.get('name')}{NS}{tool.name}"] = (t.get("name"), tool.name)
                    tool.name = f"{t.get('name')}{NS}{tool.name}"
                    conv.tools.append(tool)
        else:
            tool = _tool(t, w, conv)
            if tool is not None:
                conv.tools.append(tool)
    tc = body.get("tool_choice")
    if isinstance(tc, str):
        need(tc in ("auto", "none", "required"), "tool_choice must be auto, none, required or a named tool")
        conv.tool_choice = tc
    elif tc is not None:
        if as_dict(tc, "tool_choice").get("type") in ("function", "custom") and isinstance(tc.get("name"), str):
            conv.tool_choice = {"name": tc["name"]}
        else:
            conv.dropped.append(f"tool_choice ({tc.get('type')})")
    if isinstance(body.get("parallel_tool_calls"), bool):
        conv.parallel_tool_calls = body["parallel_tool_calls"]
    conv.max_tokens = number(body, "max_output_tokens", integer=True)
    conv.temperature, conv.top_p = number(body, "temperature"), number(body, "top_p")
    effort = (body.get("reasoning") or {}).get("effort") if isinstance(body.get("reasoning"), dict) else None
    if isinstance(effort, str) and effort != "none":
        conv.reasoning = effort
    user = body.get("safety_identifier") or body.get("user")
    conv.user = user if isinstance(user, str) else None
    if isinstance(body.get("text"), dict) and body["text"].get("format", {}).get("type") not in (None, "text"):
        conv.dropped.append("text.format (structured output)")
    known = {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
             "temperature", "top_p", "stream", "reasoning", "previous_response_id", "conversation", *_HINTS}
    conv.dropped += [k for k in body if k not in known]
    return conv


def _tool(t: dict, where: str, conv: Conversation) -> Tool | None:
    kind = as_dict(t, where).get("type")
    if kind == "function":
        need(isinstance(t.get("name"), str), f"{where} needs a name")
        return Tool(t["name"], t.get("description"), as_dict(t.get("parameters") or {}, where), strict=t.get("strict"))
    if kind == "custom":
        need(isinstance(t.get("name"), str), f"{where} needs a name")
        return Tool(t["name"], t.get("description"), {}, custom=True)
    conv.dropped.append(f"{where} ({kind}: a tool the provider hosts)")
    return None


def _content_item(p) -> dict:
    if isinstance(p, Text):
        return {"type": "input_text", "text": p.text}
    return {"type": "input_image", "image_url": p.url, "detail": "auto"}


def build_request(conv: Conversation) -> dict:
    items: list[dict] = []
    custom_calls = set()
    for turn in conv.turns:
        if turn.role == "assistant":
            text = "".join(p.text for p in turn.parts if isinstance(p, Text))
            if text:
                items.append({"type": "message", "role": "assistant", "content": text})
            for p in turn.parts:
                if isinstance(p, ToolCall) and p.custom:
                    custom_calls.add(p.id)
                    items.append({"type": "custom_tool_call", "call_id": p.id, "name": p.name, "input": p.arguments})
                elif isinstance(p, ToolCall):
                    items.append({"type": "function_call", "call_id": p.id, "name": p.name, "arguments": p.arguments})
            continue
        for r in (p for p in turn.parts if isinstance(p, ToolResult)):
            out = "\n".join(p.text for p in r.content) if all(isinstance(p, Text) for p in r.content) else \
                [_content_item(p) for p in r.content]
            kind = "custom_tool_call_output" if r.call_id in custom_calls else "function_call_output"
            items.append({"type": kind, "call_id": r.call_id, "output": out})
        rest = [p for p in turn.parts if isinstance(p, (Text, Image))]
        if rest:
            items.append({"type": "message", "role": turn.role, "content": [_content_item(p) for p in rest]})
    body: dict = {"model": conv.model, "input": items, "store": False}
    if conv.system:
        body["instructions"] = "\n\n".join(conv.system)
    if conv.tools:
        body["tools"] = [{"type": "custom", "name": t.name, **({"description": t.description} if t.description else {})}
                         if t.custom else
                         {"type": "function", "name": t.name, "description": t.description or "",
                          "parameters": {"type": "object", **t.parameters}, "strict": bool(t.strict)}
                         for t in conv.tools]
        if conv.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = conv.parallel_tool_calls
    if conv.tool_choice is not None and (conv.tools or conv.tool_choice == "none"):
        body["tool_choice"] = conv.tool_choice if isinstance(conv.tool_choice, str) else \
            {"type": "function", "name": conv.tool_choice["name"]}
    if conv.max_tokens is not None:
        body["max_output_tokens"] = conv.max_tokens
    if conv.temperature is not None:
        body["temperature"] = conv.temperature
    if conv.top_p is not None:
        body["top_p"] = conv.top_p
    if conv.stop:
        conv.dropped.append("stop sequences (the Responses API has none)")
    if conv.reasoning:
        body["reasoning"] = {"effort": conv.reasoning}
    if conv.user:
        body["user"] = conv.user
    if conv.stream:
        body["stream"] = True
    return body


# ---- answers ----------------------------------------------------------------------------------------------------
def usage_in(u: dict | None) -> Usage:
    u = u or {}
    return Usage(input=u.get("input_tokens") or 0, output=u.get("output_tokens") or 0,
                 cached=(u.get("input_tokens_details") or {}).get("cached_tokens") or 0,
                 reasoning=(u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)


def usage_out(u: Usage) -> dict:
    return {"input_tokens": u.input, "output_tokens": u.output, "total_tokens": u.input + u.output,
            "input_tokens_details": {"cached_tokens": u.cached},
            "output_tokens_details": {"reasoning_tokens": u.reasoning}}


def item_parts(item: dict) -> list:
    kind = item.get("type")
    if kind == "reasoning":
        texts = [s.get("text", "") for s in item.get("summary") or []] or \
            [c.get("text", "") for c in item.get("content") or []]
        return [Thinking("\n\n".join(texts), item.get("encrypted_content"))]
    if kind == "message":
        return [Text(c.get("text", c.get("refusal", ""))) for c in item.get("content") or []
                if c.get("type") in ("output_text", "refusal")]
    if kind in ("function_call", "custom_tool_call"):
        name = f"{item['namespace']}{NS}{item.get('name')}" if item.get("namespace") else item.get("name") or ""
        custom = kind == "custom_tool_call"
        return [ToolCall(item.get("call_id") or new_id("call_"), name,
                         item.get("input" if custom else "arguments") or "", custom)]
    return []


def stop_of(obj: dict, parts: list) -> str:
    reason = (obj.get("incomplete_details") or {}).get("reason")
    if obj.get("status") == "incomplete":
        return "refusal" if reason == "content_filter" else "length"
    return "tool_calls" if any(isinstance(p, ToolCall) for p in parts) else "end"


def parse_answer(obj: dict) -> Answer:
    parts = [p for item in obj.get("output") or [] if isinstance(item, dict) for p in item_parts(item)]
    return Answer(obj.get("id") or new_id("resp_"), obj.get("model"), parts, stop_of(obj, parts),
                  usage=usage_in(obj.get("usage")), created=obj.get("created_at") or int(time.time()))


# (item type, its number among the answer's messages, or among its calls) -> the item's id. A relay makes new ones;
# generation derives them from the response id, so a stream and its record name every item alike.
ItemIds = Callable[[str, int], str]
_PREFIX = {"message": "msg_", "reasoning": "rs_"}


def new_item_id(kind: str, n: int) -> str:
    return new_id(_PREFIX.get(kind, "fc_"))


def call_kind(p: ToolCall, conv: Conversation) -> str:
    """The output item a call is, by the client's own tool kind: a local shell call, a custom (freeform) tool's,
    or a function call."""
    if p.local_shell or any(t.local_shell and t.name == p.name for t in conv.tools):
        return "local_shell_call"
    if p.custom or any(t.custom and t.name == p.name for t in conv.tools):
        return "custom_tool_call"
    return "function_call"


def call_item(p: ToolCall, conv: Conversation, item_id: str, status: str) -> dict:
    kind = call_kind(p, conv)
    if kind == "local_shell_call":
        return {"type": kind, "id": item_id, "call_id": p.id,
                "action": responses_tools.shell_action(arguments_object(p.arguments)), "status": status}
    if kind == "custom_tool_call":  # a function's {"input": text} as the text; other arguments as their JSON
        args = {} if p.custom else arguments_object(p.arguments)
        text = p.arguments if p.custom or "_raw_arguments" in args else responses_tools.custom_input(args)
        item = {"type": kind, "id": item_id, "call_id": p.id, "name": p.name, "input": text, "status": status}
    else:
        item = {"type": kind, "id": item_id, "call_id": p.id, "name": p.name, "arguments": p.arguments,
                "status": status}
    if p.name in conv.namespaces:
        item["namespace"], item["name"] = conv.namespaces[p.name]
    return item


def _output(parts: list, conv: Conversation, ids: ItemIds) -> list[dict]:
    out, messages, calls = [], 0, 0
    for p in parts:
        if isinstance(p, Text):
            out.append({"type": "message", "id": ids("message", messages), "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": p.text, "annotations": []}]})
            messages += 1
        elif isinstance(p, Thinking):
            item = {"type": "reasoning", "id": ids("reasoning", 0), "summary": [{"type": "summary_text",
                                                                                 "text": p.text}]}
            if p.signature or p.redacted:
                item["encrypted_content"] = p.signature or p.redacted
            out.append(item)
        else:
            out.append(call_item(p, conv, ids(call_kind(p, conv), calls), "completed"))
            calls += 1
    return out


def listed_tools(conv: Conversation) -> list[dict]:
    """The tools a response object lists: the client's, as it gave them (hosted ones dropped are not among them;
    `strict` false: schemas are not enforced), a namespace's together."""
    out: list[dict] = []
    namespaces: dict[str, dict] = {}
    for t in conv.tools:
        if t.local_shell:
            out.append({"type": responses_tools.LOCAL_SHELL})
            continue
        ns, name = conv.namespaces.get(t.name, (None, t.name))
        tool = {"type": "custom", "name": name, "description": t.description} if t.custom else \
            {"type": "function", "name": name, "description": t.description, "parameters": t.parameters,
             "strict": False}
        if ns is None:
            out.append(tool)
            continue
        if ns not in namespaces:
            namespaces[ns] = {"type": "namespace", "name": ns, "description": "", "tools": []}
            out.append(namespaces[ns])
        namespaces[ns]["tools"].append(tool)
    return out


def _choice(conv: Conversation):
    choice = conv.tool_choice
    return {"type": "function", "name": choice["name"]} if isinstance(choice, dict) else choice or "auto"


def response_object(rid: str, model, created: int, status: str, output: list, usage: Usage | None,
                    stop: str = "end", conv: Conversation | None = None) -> dict:
    """A response object; with the client's conversation, its tools, tool choice and parallel calls echoed."""
    obj = {"id": rid, "object": "response", "created_at": created, "model": model, "status": status,
           "output": output, "error": None,
           "parallel_tool_calls": True if conv is None else conv.parallel_tool_calls is not False,
           "tool_choice": "auto" if conv is None else _choice(conv),
           "tools": [] if conv is None else listed_tools(conv), "instructions": None, "metadata": {},
           "temperature": None, "top_p": None,
           "incomplete_details": {"reason": "content_filter" if stop == "refusal" else "max_output_tokens"}
           if status == "incomplete" else None}
    if usage is not None:
        obj["usage"] = usage_out(usage)
    return obj


def build_answer(ans: Answer, conv: Conversation, ids: ItemIds = new_item_id) -> dict:
    status = "incomplete" if ans.stop in ("length", "refusal") else "completed"
    return response_object(ans.id if ans.id.startswith("resp_") else new_id("resp_"), ans.model,
                           ans.created or int(time.time()), status, _output(ans.parts, conv, ids) or
                           [{"type": "message", "id": ids("message", 0), "status": "completed", "role": "assistant",
                             "content": [{"type": "output_text", "text": "", "annotations": []}]}],
                           ans.usage, ans.stop, conv)


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
