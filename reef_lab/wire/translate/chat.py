"""OpenAI chat completions (https://platform.openai.com/docs/api-reference/chat) read into and written from the
neutral form. The widest-spoken dialect: vLLM, SGLang, llama.cpp and most open-model hosts serve it. Reasoning
arrives as `reasoning_content` (vLLM, SGLang, DeepSeek) or `reasoning` (OpenRouter) and is never sent back (DeepSeek
refuses it in a request)."""

from __future__ import annotations

import time

import orjson

from reef_lab.wire import OPENAI_CHAT, tools
from reef_lab.wire.translate.common import (as_dict, as_list, bounded, engine_stops, engine_text, image_url,
                                               json_text, need, new_id, number, stop_list, texts_only)
from reef_lab.wire.translate.ir import (Answer, BlockStart, BlockStop, Conversation, Delta, Failure, Finish,
                                           Image, Start, Text, Thinking, Tool, ToolCall, ToolResult, Turn, Usage)

STOP_IN = {"stop": "end", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
           "content_filter": "refusal"}
STOP_OUT = {"end": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls",
            "refusal": "content_filter", "pause": "stop"}
_HINTS = {"stream_options", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
          "logprobs", "top_logprobs", "seed", "user", "n"}
MAX_STOPS = 4  # OpenAI's limit


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
        if kind in ("text", "refusal", "input_text", "output_text"):
            text = p.get("text", p.get("refusal"))
            need(isinstance(text, str), f"{w} needs a string '{kind}'")
            out.append(Text(text))
        elif kind == "image_url":
            out.append(image_url((p.get("image_url") or {}).get("url"), w))
        else:
            need(False, f"{w}: content of type {kind!r} cannot be translated to another provider's API "
                        "(text and image_url can)")
    return out


def parse_request(body: dict, strict: bool = False) -> Conversation:
    """The request in the neutral form. `strict`: read for an engine here, whose model reads text: an image, a tool
    that is not a function or a malformed call is a 400 naming the field, sampling fields are checked against the
    engines' limits, and every tool result must answer an earlier call (a relay leaves such checks to the provider)."""
    need(isinstance(body, dict), "the request body must be a JSON object")
    conv = Conversation(system=[], turns=[], model=body.get("model"), stream=bool(body.get("stream")))
    msgs = body.get("messages")
    need(isinstance(msgs, list) and bool(msgs), "'messages' must be a non-empty list of {role, content} objects")
    if strict:
        conv.tools = [Tool(f["name"], f.get("description"), f["parameters"]) for f in
                      (t["function"] for t in tools.read_tools(body, OPENAI_CHAT))]
        conv.tool_choice, conv.parallel_tool_calls = tools.choice_of(body, OPENAI_CHAT)
    calls: set[str] = set()
    for i, m in enumerate(msgs):
        w = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        need(role in ("system", "developer", "user", "assistant", "tool"),
             f"{w}.role must be one of system, developer, user, assistant, tool")
        parts = [engine_text(m.get("content"), w)] if strict else None
        if role in ("system", "developer"):
            text = "".join(p.text for p in parts or _parts(m.get("content"), w) if isinstance(p, Text))
            if conv.turns:
                conv.turns.append(Turn("system", [Text(text)]))
            else:
                conv.system.append(text)
        elif role == "tool":
            cid = m.get("tool_call_id")
            if strict:
                tools.answers(cid, calls, f"{w}.tool_call_id")
            need(isinstance(cid, str), f"{w} needs a tool_call_id")
            result = ToolResult(cid, parts or _parts(m.get("content"), w))
            if conv.turns and conv.turns[-1].role == "user" and all(isinstance(p, ToolResult)
                                                                     for p in conv.turns[-1].parts):
                conv.turns[-1].parts.append(result)
            else:
                conv.turns.append(Turn("user", [result]))
        elif role == "user":
            conv.turns.append(Turn("user", parts or _parts(m.get("content"), w)))
        else:
            turn = Turn("assistant", [])
            reasoning = m.get("reasoning_content") or m.get("reasoning")
            if isinstance(reasoning, str) and reasoning and not strict:  # an engine's model is not shown it
                turn.parts.append(Thinking(reasoning))
            turn.parts += parts or _parts(m.get("content"), w)
            tcs = m.get("tool_calls")
            need(tcs is None or isinstance(tcs, list), f"{w}.tool_calls must be a list")
            for k, tc in enumerate(tcs or []):
                wk = f"{w}.tool_calls[{k}]"
                if strict:
                    cid, name, args = tools.chat_call(tc, wk, calls)
                    turn.parts.append(ToolCall(cid, name, json_text(args)))
                    continue
                fn = as_dict(as_dict(tc, wk).get("function"), f"{wk}.function")
                need(isinstance(fn.get("name"), str) and isinstance(tc.get("id"), str),
                     f"{wk} needs an id and a function name")
                args = fn.get("arguments")
                turn.parts.append(ToolCall(tc["id"], fn["name"], json_text(args) if args is not None else "{}"))
            conv.turns.append(turn)
    if not strict:
        tools_in = body.get("tools") or []
        need(isinstance(tools_in, list), "'tools' must be a list of tool objects")
        for i, t in enumerate(tools_in):
            w = f"tools[{i}]"
            kind = as_dict(t, w).get("type")
            if kind == "function":
                fn = as_dict(t.get("function"), f"{w}.function")
                need(isinstance(fn.get("name"), str), f"{w}.function needs a name")
                conv.tools.append(Tool(fn["name"], fn.get("description"), as_dict(fn.get("parameters") or {}, w),
                                       strict=fn.get("strict")))
            elif kind == "custom":
                c = as_dict(t.get("custom"), f"{w}.custom")
                conv.tools.append(Tool(c.get("name"), c.get("description"), {}, custom=True))
            else:
                conv.dropped.append(f"{w} ({kind})")
        tc = body.get("tool_choice")
        if isinstance(tc, str):
            need(tc in ("auto", "none", "required"), "tool_choice must be auto, none, required or a named function")
            conv.tool_choice = tc
        elif tc is not None:
            fn = (as_dict(tc, "tool_choice").get("function") or {}) if tc.get("type") == "function" else {}
            if isinstance(fn.get("name"), str):
                conv.tool_choice = {"name": fn["name"]}
            else:
                conv.dropped.append(f"tool_choice ({tc.get('type')})")
        if isinstance(body.get("parallel_tool_calls"), bool):
            conv.parallel_tool_calls = body["parallel_tool_calls"]
    if strict:
        mct = body.get("max_completion_tokens", body.get("max_tokens"))
        conv.max_tokens = bounded(body, "max_tokens", 1, 32768, integer=True, value=mct)
        conv.temperature, conv.top_p = bounded(body, "temperature", 0, 2), bounded(body, "top_p", 0, 1)
        conv.stop = engine_stops(body.get("stop"), "stop")
        conv.seed = bounded(body, "seed", -2**63, 2**63 - 1, integer=True)
        need(bounded(body, "n", 1, 1, integer=True) in (None, 1), "'n' must be 1")
        return conv
    need(body.get("n") in (None, 1), "'n' must be 1 when the provider speaks another dialect")
    conv.max_tokens = number(body, "max_completion_tokens", integer=True) or number(body, "max_tokens", integer=True)
    conv.temperature, conv.top_p = number(body, "temperature"), number(body, "top_p")
    conv.stop = stop_list(body.get("stop"), "stop")
    if isinstance(body.get("reasoning_effort"), str) and body["reasoning_effort"] != "none":
        conv.reasoning = body["reasoning_effort"]
    user = body.get("safety_identifier") or body.get("user")
    conv.user = user if isinstance(user, str) else None
    known = {"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens", "max_completion_tokens",
             "temperature", "top_p", "stop", "stream", "reasoning_effort", *_HINTS}
    conv.dropped += [k for k in body if k not in known]
    return conv


def _user_content(parts: list):
    if all(isinstance(p, Text) for p in parts):
        return "".join(p.text for p in parts)
    return [{"type": "text", "text": p.text} if isinstance(p, Text) else
            {"type": "image_url", "image_url": {"url": p.url}} for p in parts]


def build_request(conv: Conversation) -> dict:
    messages: list[dict] = []
    if conv.system:
        messages.append({"role": "system", "content": "\n\n".join(conv.system)})
    for i, turn in enumerate(conv.turns):
        if turn.role == "assistant":
            text = "".join(p.text for p in turn.parts if isinstance(p, Text))
            calls = [{"id": p.id, "type": "function", "function": {
                "name": p.name, "arguments": _wrap_custom(p)}} for p in turn.parts if isinstance(p, ToolCall)]
            if not text and not calls:
                continue
            msg = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = calls
            messages.append(msg)
            continue
        results = [p for p in turn.parts if isinstance(p, ToolResult)]
        for r in results:  # tool messages must follow the assistant message that called them
            messages.append({"role": "tool", "tool_call_id": r.call_id,
                             "content": texts_only(r.content, f"turn {i}")})
        rest = [p for p in turn.parts if isinstance(p, (Text, Image))]
        if rest:
            messages.append({"role": turn.role, "content": _user_content(rest)})
    body: dict = {"model": conv.model, "messages": messages}
    if conv.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description else {}),
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
            if t.custom else {"type": "object", **t.parameters},
            **({"strict": t.strict} if t.strict is not None else {})}} for t in conv.tools]
        if conv.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = conv.parallel_tool_calls
    if conv.tool_choice is not None and (conv.tools or conv.tool_choice == "none"):
        body["tool_choice"] = conv.tool_choice if isinstance(conv.tool_choice, str) else \
            {"type": "function", "function": {"name": conv.tool_choice["name"]}}
    if conv.max_tokens is not None:
        body["max_tokens"] = conv.max_tokens
    if conv.temperature is not None:
        body["temperature"] = conv.temperature
    if conv.top_p is not None:
        body["top_p"] = conv.top_p
    if conv.stop:
        body["stop"] = conv.stop[:MAX_STOPS]
        if len(conv.stop) > MAX_STOPS:
            conv.dropped.append(f"stop sequences past the first {MAX_STOPS}")
    if conv.reasoning:
        body["reasoning_effort"] = conv.reasoning
    if conv.user:
        body["user"] = conv.user
    if conv.stream:
        body["stream"], body["stream_options"] = True, {"include_usage": True}
    return body


def _wrap_custom(call: ToolCall) -> str:
    return orjson.dumps({"input": call.arguments}).decode() if call.custom else call.arguments


# ---- answers ----------------------------------------------------------------------------------------------------
def usage_in(u: dict | None) -> Usage:
    u = u or {}
    return Usage(input=u.get("prompt_tokens") or 0, output=u.get("completion_tokens") or 0,
                 cached=(u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                 reasoning=(u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)


def usage_out(u: Usage) -> dict:
    return {"prompt_tokens": u.input, "completion_tokens": u.output, "total_tokens": u.input + u.output,
            "prompt_tokens_details": {"cached_tokens": u.cached},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning}}


def parse_answer(obj: dict) -> Answer:
    choice = (obj.get("choices") or [{}])[0]
    msg, parts = choice.get("message") or {}, []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        parts.append(Thinking(reasoning))
    if isinstance(msg.get("content"), str) and msg["content"]:
        parts.append(Text(msg["content"]))
    elif isinstance(msg.get("refusal"), str) and msg["refusal"]:
        parts.append(Text(msg["refusal"]))
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        parts.append(ToolCall(tc.get("id") or new_id("call_"), fn.get("name") or "", fn.get("arguments") or ""))
    stop = STOP_IN.get(choice.get("finish_reason"), "end")
    if any(isinstance(p, ToolCall) for p in parts):
        stop = "tool_calls"  # some servers answer "stop" with tool calls
    return Answer(obj.get("id") or new_id("chatcmpl-"), obj.get("model"), parts, stop,
                  usage=usage_in(obj.get("usage")), created=obj.get("created") or int(time.time()))


def build_answer(ans: Answer, conv: Conversation) -> dict:
    text = "".join(p.text for p in ans.parts if isinstance(p, Text))
    called = any(isinstance(p, ToolCall) for p in ans.parts)
    # as OpenAI answers: null content beside calls, "" for an empty answer without any
    msg: dict = {"role": "assistant", "content": text or (None if called else ""), "refusal": None}
    thinking = "".join(p.text for p in ans.parts if isinstance(p, Thinking))
    if thinking:
        msg["reasoning_content"] = thinking
    calls = [{"id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}
             for p in ans.parts if isinstance(p, ToolCall)]
    if calls:
        msg["tool_calls"] = calls
    return {"id": ans.id, "object": "chat.completion", "created": ans.created or int(time.time()), "model": ans.model,
            "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": STOP_OUT[ans.stop]}],
            "usage": usage_out(ans.usage)}


# ---- streams ----------------------------------------------------------------------------------------------------
class Reader:
    """Chat chunks in, neutral events out. Chunks carry no block boundaries: a block opens when its kind of delta
    first comes (text, reasoning, or a tool call's index) and closes when another begins or the stream ends; a late
    argument piece for an earlier call goes to that call's block (clients accumulate by index)."""

    def __init__(self):
        self.started, self.finished = False, False
        self.current: int | None = None
        self.kind: dict[int, str] = {}
        self.calls: dict[int, int] = {}  # tool call index -> block index
        self.next = 0
        self.stop, self.usage = "end", None

    def _open(self, kind: str, part) -> list:
        out = self._close()
        i, self.next = self.next, self.next + 1
        self.current, self.kind[i] = i, kind
        return out + [BlockStart(i, part)]

    def _close(self) -> list:
        if self.current is None:
            return []
        i, self.current = self.current, None
        return [BlockStop(i)]

    def feed(self, name: str | None, obj) -> list:
        if obj == "[DONE]":
            return self.end()
        if not isinstance(obj, dict):
            return []
        if isinstance(obj.get("error"), dict):
            err = obj["error"]
            return [Failure(err.get("message") or "the provider's stream failed", err.get("type") or "api_error")]
        out = []
        if not self.started:
            self.started = True
            out.append(Start(obj.get("id") or new_id("chatcmpl-"), obj.get("model")))
        if obj.get("usage"):
            self.usage = usage_in(obj["usage"])
        for ch in obj.get("choices") or []:
            if ch.get("index", 0) != 0:
                continue
            d = ch.get("delta") or {}
            reasoning = d.get("reasoning_content") or d.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                if self.current is None or self.kind[self.current] != "thinking":
                    out += self._open("thinking", Thinking(""))
                out.append(Delta(self.current, reasoning))
            if isinstance(d.get("content"), str) and d["content"]:
                if self.current is None or self.kind[self.current] != "text":
                    out += self._open("text", Text(""))
                out.append(Delta(self.current, d["content"]))
            for tc in d.get("tool_calls") or []:
                k = tc.get("index", 0)
                fn = tc.get("function") or {}
                if k not in self.calls:
                    out += self._open("tool", ToolCall(tc.get("id") or new_id("call_"), fn.get("name") or "", ""))
                    self.calls[k] = self.current
                if fn.get("arguments"):
                    out.append(Delta(self.calls[k], fn["arguments"]))
            if ch.get("finish_reason"):
                self.stop = STOP_IN.get(ch["finish_reason"], "end")
        return out

    def end(self) -> list:
        if self.finished or not self.started:
            return []
        self.finished = True
        stop = "tool_calls" if self.calls and self.stop == "end" else self.stop
        return self._close() + [Finish(stop, None, self.usage)]


class Writer:
    """Neutral events in, chat chunks out as (None, object) pairs; `close` gives the usage chunk (the receipt
    rides on it) and `[DONE]`."""

    def __init__(self, conv: Conversation | None):
        self.id, self.model, self.created = new_id("chatcmpl-"), None, int(time.time())
        # with tools offered the content starts null, as OpenAI's does for answers that may be only calls
        self.first_content = None if conv is not None and conv.tools else ""
        self.kind: dict[int, str] = {}
        self.tool_index: dict[int, int] = {}
        self.usage = Usage()

    def _chunk(self, delta: dict, finish: str | None = None) -> tuple[None, dict]:
        return None, {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                      "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def write(self, ev) -> list:
        if isinstance(ev, Start):
            self.id, self.model = ev.id, ev.model
            return [self._chunk({"role": "assistant", "content": self.first_content})]
        if isinstance(ev, BlockStart):
            p = ev.part
            if isinstance(p, ToolCall):
                self.kind[ev.index] = "tool"
                k = self.tool_index[ev.index] = len(self.tool_index)
                return [self._chunk({"tool_calls": [{"index": k, "id": p.id, "type": "function",
                                                     "function": {"name": p.name, "arguments": ""}}]})]
            self.kind[ev.index] = "text" if isinstance(p, Text) else "thinking"
            return []
        if isinstance(ev, Delta):
            if ev.signature is not None or not ev.text:
                return []
            kind = self.kind.get(ev.index)
            if kind == "tool":
                return [self._chunk({"tool_calls": [{"index": self.tool_index[ev.index],
                                                     "function": {"arguments": ev.text}}]})]
            return [self._chunk({"content": ev.text} if kind == "text" else {"reasoning_content": ev.text})]
        if isinstance(ev, Finish):
            self.usage = ev.usage or Usage()
            return [self._chunk({}, STOP_OUT[ev.stop])]
        if isinstance(ev, Failure):
            return [(None, {"error": {"message": ev.message, "type": ev.type, "param": None, "code": None}})]
        return []

    def close(self) -> list:
        return [(None, {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": usage_out(self.usage)}), (None, "[DONE]")]


def error_body(status: int, message: str, kind: str) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
