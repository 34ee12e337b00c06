"""Anthropic messages (https://docs.anthropic.com/en/api/messages) read into and written from the neutral form."""

from __future__ import annotations

from reef_lab.wire import ANTHROPIC, tools
from reef_lab.wire.translate.common import (arguments_object, as_dict, as_list, bounded, engine_stops, engine_text,
                                               image_url, json_text, need, new_id, number, split_data_url, stop_list)
from reef_lab.wire.translate.ir import (BUDGET_OF_EFFORT, Answer, BlockStart, BlockStop, Conversation, Delta,
                                           Failure, Finish, Image, Start, Text, Thinking, Tool, ToolCall, ToolResult,
                                           Turn, Usage, effort_from_budget)

DEFAULT_MAX_TOKENS = 8192  # Anthropic requires max_tokens; the other dialects may leave it out
STOP_IN = {"end_turn": "end", "max_tokens": "length", "stop_sequence": "stop_sequence", "tool_use": "tool_calls",
           "refusal": "refusal", "pause_turn": "pause", "model_context_window_exceeded": "length"}
STOP_OUT = {"end": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence", "tool_calls": "tool_use",
            "refusal": "refusal", "pause": "pause_turn"}
_HINTS = {"metadata", "cache_control", "context_management", "service_tier", "anthropic_version", "container",
          "output_config", "inference_geo", "speed"}  # no bearing on what a translated provider generates


# ---- requests ---------------------------------------------------------------------------------------------------
def _image(block: dict, where: str) -> Image:
    src = as_dict(block.get("source"), f"{where}.source")
    if src.get("type") == "base64":
        need(isinstance(src.get("media_type"), str) and isinstance(src.get("data"), str),
             f"{where}.source needs media_type and data")
        return Image(f"data:{src['media_type']};base64,{src['data']}")
    if src.get("type") == "url":
        return image_url(src.get("url"), where)
    need(False, f"{where}: image source type {src.get('type')!r} cannot be translated (base64 and url can)")


def _blocks(content, where: str, conv: Conversation) -> list:
    if isinstance(content, str):
        return [Text(content)]
    out = []
    for j, b in enumerate(as_list(content, f"{where}.content")):
        w = f"{where}.content[{j}]"
        kind = as_dict(b, w).get("type")
        if kind == "text":
            need(isinstance(b.get("text"), str), f"{w} needs a string 'text'")
            out.append(Text(b["text"]))
        elif kind == "image":
            out.append(_image(b, w))
        elif kind == "tool_use":
            need(isinstance(b.get("id"), str) and isinstance(b.get("name"), str), f"{w} needs an id and a name")
            out.append(ToolCall(b["id"], b["name"], json_text(b.get("input") or {})))
        elif kind == "tool_result":
            need(isinstance(b.get("tool_use_id"), str), f"{w} needs a tool_use_id")
            parts = _blocks(b.get("content") or [], w, conv)
            need(all(isinstance(p, (Text, Image)) for p in parts), f"{w}: a tool result holds text and images only")
            out.append(ToolResult(b["tool_use_id"], parts, bool(b.get("is_error"))))
        elif kind == "thinking":
            out.append(Thinking(b.get("thinking") or "", b.get("signature")))
        elif kind == "redacted_thinking":
            out.append(Thinking("", redacted=b.get("data")))
        elif kind in ("document", "search_result", "container_upload"):
            need(False, f"{w}: {kind} blocks cannot be translated to another provider's API")
        else:  # server tool use and its results ran at Anthropic; no other provider can replay them
            conv.dropped.append(f"{w} ({kind})")
    return out


def _engine_turn(role: str, content, where: str, calls: set[str]) -> Turn:
    """A message read for an engine here: text (other blocks refused), tool_use blocks in an assistant message and
    tool_result blocks in a user message, checked; a turn's text blocks joined into one text."""
    if not (isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")
                                              for b in content)):
        return Turn(role, [engine_text(content, where)])
    texts, parts = [], []
    for j, b in enumerate(content):
        w = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_use" and role == "assistant":
            need(isinstance(b.get("input"), dict), f"{w}.input must be an object")
            tools.call(w, b.get("id"), b.get("name"), calls)
            parts.append(ToolCall(b["id"], b["name"], json_text(b["input"])))
        elif kind == "tool_result" and role == "user":
            text = engine_text(b.get("content"), f"{w}.content")
            tools.answers(b.get("tool_use_id"), calls, f"{w}.tool_use_id")
            parts.append(ToolResult(b["tool_use_id"], [text], b.get("is_error") is True))
        elif kind in ("tool_use", "tool_result"):
            need(False, f"{w}: a {kind} block belongs in {'an assistant' if kind == 'tool_use' else 'a user'} message")
        else:
            texts.append(engine_text([b], w).text)
    text = Text("".join(texts))
    return Turn(role, [text] + parts if role == "assistant" else parts + ([text] if text.text else []))


def parse_request(body: dict, strict: bool = False) -> Conversation:
    """The request in the neutral form. `strict`: read for an engine here (text only, client tools only, `max_tokens`
    required and the engines' sampling limits, every tool result answering an earlier call), not for a relay."""
    need(isinstance(body, dict), "the request body must be a JSON object")
    conv = Conversation(system=[], turns=[], model=body.get("model"), stream=bool(body.get("stream")))
    if strict:
        need(body.get("max_tokens") is not None, "'max_tokens' is required")
        conv.tools = [Tool(f["name"], f.get("description"), f["parameters"]) for f in
                      (t["function"] for t in tools.read_tools(body, ANTHROPIC))]
        conv.tool_choice, conv.parallel_tool_calls = tools.choice_of(body, ANTHROPIC)
    system = body.get("system")
    if strict and system is not None:
        conv.system.append(engine_text(system, "system").text)
    elif isinstance(system, str):
        conv.system.append(system)
    elif system is not None:
        conv.system += [p.text for p in _blocks(system, "system", conv) if isinstance(p, Text)]
    msgs = body.get("messages")
    need(isinstance(msgs, list) and bool(msgs), "'messages' must be a non-empty list of {role, content} objects")
    calls: set[str] = set()
    for i, m in enumerate(msgs):
        need(isinstance(m, dict) and m.get("role") in ("user", "assistant", *(() if strict else ("system",))),
             f"messages[{i}].role must be 'user' or 'assistant'")
        conv.turns.append(_engine_turn(m["role"], m.get("content"), f"messages[{i}]", calls) if strict else
                          Turn(m["role"], _blocks(m.get("content"), f"messages[{i}]", conv)))
    if strict:
        conv.max_tokens = bounded(body, "max_tokens", 1, 32768, integer=True)
        conv.temperature, conv.top_p = bounded(body, "temperature", 0, 1), bounded(body, "top_p", 0, 1)
        conv.stop = engine_stops(body.get("stop_sequences"), "stop_sequences")
        return conv
    tools_in = body.get("tools") or []
    need(isinstance(tools_in, list), "'tools' must be a list of tool objects")
    for i, t in enumerate(tools_in):
        w = f"tools[{i}]"
        if as_dict(t, w).get("type") not in (None, "custom"):
            conv.dropped.append(f"{w} ({t.get('type')}: an Anthropic-defined tool)")
            continue
        need(isinstance(t.get("name"), str), f"{w} needs a name")
        conv.tools.append(Tool(t["name"], t.get("description"), as_dict(t.get("input_schema") or {}, w)))
    tc = body.get("tool_choice")
    if tc is not None:
        kind = as_dict(tc, "tool_choice").get("type")
        need(kind in ("auto", "any", "tool", "none"), "tool_choice.type must be auto, any, tool or none")
        conv.tool_choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or {"name": tc.get("name")}
        if tc.get("disable_parallel_tool_use"):
            conv.parallel_tool_calls = False
    conv.max_tokens = number(body, "max_tokens", integer=True)
    conv.temperature, conv.top_p = number(body, "temperature"), number(body, "top_p")
    conv.stop = stop_list(body.get("stop_sequences"), "stop_sequences")
    thinking = body.get("thinking") or {}
    if as_dict(thinking, "thinking").get("type") == "enabled":
        conv.reasoning_budget = number(thinking, "budget_tokens", integer=True)
        conv.reasoning = effort_from_budget(conv.reasoning_budget or 0)
    elif thinking.get("type") == "adaptive":
        conv.reasoning = "medium"
    effort = (body.get("output_config") or {}).get("effort") if isinstance(body.get("output_config"), dict) else None
    if conv.reasoning and isinstance(effort, str):
        conv.reasoning = effort
    known = {"model", "messages", "system", "tools", "tool_choice", "max_tokens", "temperature", "top_p",
             "stop_sequences", "stream", "thinking", *_HINTS}
    conv.dropped += [k for k in body if k not in known]
    return conv


def _image_block(img: Image) -> dict:
    data = split_data_url(img.url)
    if data:
        return {"type": "image", "source": {"type": "base64", "media_type": data[0], "data": data[1]}}
    return {"type": "image", "source": {"type": "url", "url": img.url}}


def _content(parts: list, thinking_on: bool) -> list[dict]:
    out = []
    for p in parts:
        if isinstance(p, Text):
            if p.text:  # Anthropic refuses empty text blocks
                out.append({"type": "text", "text": p.text})
        elif isinstance(p, Image):
            out.append(_image_block(p))
        elif isinstance(p, ToolCall):
            out.append({"type": "tool_use", "id": p.id, "name": p.name,
                        "input": {"input": p.arguments} if p.custom else arguments_object(p.arguments)})
        elif isinstance(p, ToolResult):
            inner = _content(p.content, thinking_on)
            only_text = all(b["type"] == "text" for b in inner)
            out.append({"type": "tool_result", "tool_use_id": p.call_id, "is_error": p.is_error,
                        "content": "\n".join(b["text"] for b in inner) if only_text else inner})
        elif isinstance(p, Thinking) and thinking_on:  # replayed only where it can be checked
            if p.redacted:
                out.append({"type": "redacted_thinking", "data": p.redacted})
            elif p.signature:
                out.append({"type": "thinking", "thinking": p.text, "signature": p.signature})
    return out


def _unsigned_tool_turn(conv: Conversation) -> bool:
    last = next((t for t in reversed(conv.turns) if t.role == "assistant"), None)
    return last is not None and any(isinstance(p, ToolCall) for p in last.parts) and not any(
        isinstance(p, Thinking) and (p.signature or p.redacted) for p in last.parts)


def build_request(conv: Conversation) -> dict:
    body: dict = {"model": conv.model, "max_tokens": conv.max_tokens or DEFAULT_MAX_TOKENS}
    thinking_on = conv.reasoning is not None and conv.reasoning not in ("none", "minimal")
    if thinking_on:
        budget = conv.reasoning_budget or BUDGET_OF_EFFORT.get(conv.reasoning, 8192)
        budget = min(budget, body["max_tokens"] - 1)
        if budget >= 1024:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        else:
            thinking_on = False
            conv.dropped.append(f"reasoning ({conv.reasoning}): max tokens {body['max_tokens']} leave no room for "
                                "Anthropic's smallest thinking budget (1024)")
    if thinking_on and _unsigned_tool_turn(conv):
        body.pop("thinking")
        thinking_on = False
        conv.dropped.append("reasoning: the last assistant turn called tools without a signed thinking block, "
                            "which Anthropic requires with thinking on")
    if conv.system:
        body["system"] = "\n\n".join(conv.system)
    messages: list[dict] = []
    for i, turn in enumerate(conv.turns):
        role = turn.role
        if role == "system":
            role = "user"
            conv.dropped.append(f"turn {i}: a system message mid-conversation, sent as user text")
        content = _content(turn.parts, thinking_on)
        if not content:
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += content
        else:
            messages.append({"role": role, "content": content})
    for m in messages:  # tool results must open their user message
        if m["role"] == "user":
            m["content"].sort(key=lambda b: b["type"] != "tool_result")
    body["messages"] = messages
    if conv.tools:
        body["tools"] = [{"name": t.name, **({"description": t.description} if t.description else {}),
                          "input_schema": {"type": "object", "properties": {"input": {"type": "string"}},
                                           "required": ["input"]} if t.custom else
                          {"type": "object", **t.parameters}} for t in conv.tools]
    choice = conv.tool_choice
    if conv.tools and (choice is not None or conv.parallel_tool_calls is False):
        tc = {"auto": {"type": "auto"}, "required": {"type": "any"}, "none": {"type": "none"}}.get(choice) \
            if isinstance(choice, str) or choice is None else {"type": "tool", "name": choice["name"]}
        tc = tc or {"type": "auto"}
        if conv.parallel_tool_calls is False and tc["type"] != "none":
            tc["disable_parallel_tool_use"] = True
        body["tool_choice"] = tc
    if conv.temperature is not None:
        if thinking_on:
            conv.dropped.append("temperature (Anthropic takes none with thinking)")
        else:
            body["temperature"] = min(conv.temperature, 1.0)
    if conv.top_p is not None and (not thinking_on or conv.top_p >= 0.95):
        body["top_p"] = conv.top_p
    if conv.stop:
        body["stop_sequences"] = conv.stop
    if conv.user:
        body["metadata"] = {"user_id": conv.user}
    if conv.stream:
        body["stream"] = True
    return body


# ---- answers ----------------------------------------------------------------------------------------------------
def usage_in(u: dict | None) -> Usage:
    u = u or {}
    cached, written = u.get("cache_read_input_tokens") or 0, u.get("cache_creation_input_tokens") or 0
    return Usage(input=(u.get("input_tokens") or 0) + cached + written, output=u.get("output_tokens") or 0,
                 cached=cached, cache_write=written)


def usage_out(u: Usage) -> dict:
    return {"input_tokens": max(0, u.input - u.cached - u.cache_write), "output_tokens": u.output,
            "cache_read_input_tokens": u.cached, "cache_creation_input_tokens": u.cache_write}


def parse_answer(obj: dict) -> Answer:
    parts = []
    for b in obj.get("content") or []:
        kind = b.get("type")
        if kind == "text":
            parts.append(Text(b.get("text") or ""))
        elif kind == "thinking":
            parts.append(Thinking(b.get("thinking") or "", b.get("signature")))
        elif kind == "redacted_thinking":
            parts.append(Thinking("", redacted=b.get("data")))
        elif kind == "tool_use":
            parts.append(ToolCall(b.get("id") or new_id("toolu_"), b.get("name") or "", json_text(b.get("input"))))
    return Answer(obj.get("id") or new_id("msg_"), obj.get("model"), parts, STOP_IN.get(obj.get("stop_reason"), "end"),
                  obj.get("stop_sequence"), usage_in(obj.get("usage")))


def _block(p) -> dict:
    if isinstance(p, Text):
        return {"type": "text", "text": p.text}
    if isinstance(p, Thinking):
        if p.redacted:
            return {"type": "redacted_thinking", "data": p.redacted}
        return {"type": "thinking", "thinking": p.text, "signature": p.signature or ""}
    return {"type": "tool_use", "id": p.id, "name": p.name, "input": arguments_object(p.arguments)}


def build_answer(ans: Answer, conv: Conversation) -> dict:
    return {"id": ans.id, "type": "message", "role": "assistant", "model": ans.model,
            "content": [_block(p) for p in ans.parts], "stop_reason": STOP_OUT[ans.stop],
            "stop_sequence": ans.stop_sequence, "usage": usage_out(ans.usage)}


# ---- streams ----------------------------------------------------------------------------------------------------
class Reader:
    """Anthropic stream events in, neutral events out (the neutral stream is Anthropic's own shape)."""

    def __init__(self):
        self.stop, self.stop_sequence, self.usage, self.kinds = "end", None, Usage(), {}

    def feed(self, name: str | None, obj) -> list:
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "message_start":
            msg = obj.get("message") or {}
            self.usage = usage_in(msg.get("usage"))
            return [Start(msg.get("id") or new_id("msg_"), msg.get("model"), self.usage)]
        if kind == "content_block_start":
            i, b = obj.get("index", 0), obj.get("content_block") or {}
            self.kinds[i] = b.get("type")
            if b.get("type") == "text":
                return [BlockStart(i, Text(""))] + ([Delta(i, b["text"])] if b.get("text") else [])
            if b.get("type") == "thinking":
                return [BlockStart(i, Thinking(""))]
            if b.get("type") == "redacted_thinking":
                return [BlockStart(i, Thinking("", redacted=b.get("data")))]
            if b.get("type") == "tool_use":
                return [BlockStart(i, ToolCall(b.get("id") or new_id("toolu_"), b.get("name") or "", ""))]
            return []  # server tool blocks: ran at the provider; nothing the client can act on
        if kind == "content_block_delta":
            i, d = obj.get("index", 0), obj.get("delta") or {}
            if self.kinds.get(i) not in ("text", "thinking", "tool_use"):
                return []
            dk = d.get("type")
            if dk == "signature_delta":
                return [Delta(i, signature=d.get("signature") or "")]
            text = d.get("text") if dk == "text_delta" else d.get("thinking") if dk == "thinking_delta" else \
                d.get("partial_json") if dk == "input_json_delta" else None
            return [Delta(i, text)] if text else []
        if kind == "content_block_stop":
            i = obj.get("index", 0)
            return [BlockStop(i)] if self.kinds.get(i) in ("text", "thinking", "redacted_thinking", "tool_use") else []
        if kind == "message_delta":
            d = obj.get("delta") or {}
            self.stop = STOP_IN.get(d.get("stop_reason"), self.stop)
            self.stop_sequence = d.get("stop_sequence") or self.stop_sequence
            if obj.get("usage"):
                merged = {**usage_out(self.usage), **obj["usage"]}
                self.usage = usage_in(merged)
            return []
        if kind == "message_stop":
            return [Finish(self.stop, self.stop_sequence, self.usage)]
        if kind == "error":
            err = obj.get("error") or {}
            return [Failure(err.get("message") or "the provider's stream failed", err.get("type") or "api_error")]
        return []

    def end(self) -> list:
        return []


class Writer:
    """Neutral events in, Anthropic stream events out, as (event name, object) pairs. `message_stop`, the last
    event, comes from `close` (the receipt rides on it)."""

    def __init__(self, conv: Conversation):
        self.kinds: dict[int, str] = {}

    def write(self, ev) -> list[tuple[str, dict]]:
        if isinstance(ev, Start):
            return [("message_start", {"type": "message_start", "message": {
                "id": ev.id, "type": "message", "role": "assistant", "model": ev.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage_out(ev.usage or Usage())}})]
        if isinstance(ev, BlockStart):
            p = ev.part
            self.kinds[ev.index] = "text" if isinstance(p, Text) else "tool" if isinstance(p, ToolCall) else "thinking"
            block = {"type": "tool_use", "id": p.id, "name": p.name, "input": {}} if isinstance(p, ToolCall) \
                else {"type": "redacted_thinking", "data": p.redacted} if isinstance(p, Thinking) and p.redacted \
                else _block(p)
            return [("content_block_start", {"type": "content_block_start", "index": ev.index,
                                             "content_block": block})]
        if isinstance(ev, Delta):
            kind = self.kinds.get(ev.index)
            if ev.signature is not None:
                d = {"type": "signature_delta", "signature": ev.signature}
            elif kind == "text":
                d = {"type": "text_delta", "text": ev.text}
            elif kind == "tool":
                d = {"type": "input_json_delta", "partial_json": ev.text}
            else:
                d = {"type": "thinking_delta", "thinking": ev.text}
            return [("content_block_delta", {"type": "content_block_delta", "index": ev.index, "delta": d})]
        if isinstance(ev, BlockStop):
            return [("content_block_stop", {"type": "content_block_stop", "index": ev.index})]
        if isinstance(ev, Finish):
            usage = usage_out(ev.usage or Usage())
            return [("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": STOP_OUT[ev.stop], "stop_sequence": ev.stop_sequence}, "usage": usage})]
        if isinstance(ev, Failure):
            return [("error", {"type": "error", "error": {"type": ev.type, "message": ev.message}})]
        return []

    def close(self) -> list[tuple[str, dict]]:
        return [("message_stop", {"type": "message_stop"})]


def error_body(status: int, message: str, kind: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}
