"""Rebuild the response object of a relayed stream from its events, for the record, keeping every streamed field.

Whatever a provider streams lands in the record: text, tool calls and their arguments, thinking text and its
signature (an Anthropic conversation cannot be replayed without it), citations, reasoning summaries, logprobs,
refusals, usage, and fields this code does not know (merged: strings joined, lists extended, objects merged).
A Responses record is assembled from the streamed items; `response.completed` gives the response's final state
(status, usage) and fills in only what the items lack (some providers send it with `output: []`).
"""

from __future__ import annotations

import copy

import orjson

from reef_lab.wire import ANTHROPIC, OPENAI_CHAT

_EMPTY = (None, "", [], {})


def merge(dst: dict, src: dict, skip: tuple = ()) -> None:
    """Fold a delta into what came before: strings joined, lists extended, objects merged, anything else set."""
    for k, v in src.items():
        if k in skip:
            continue
        cur = dst.get(k)
        if v is None:
            dst.setdefault(k, None)
        elif isinstance(v, str) and isinstance(cur, str):
            dst[k] = cur + v
        elif isinstance(v, list) and isinstance(cur, list):
            cur.extend(copy.deepcopy(v))
        elif isinstance(v, dict) and isinstance(cur, dict):
            merge(cur, v)
        else:
            dst[k] = copy.deepcopy(v)


def fill(dst: dict, src: dict) -> None:
    """Take from `src` only what `dst` lacks (missing or empty)."""
    for k, v in src.items():
        if dst.get(k) in _EMPTY and v not in _EMPTY:
            dst[k] = copy.deepcopy(v)


def settle(dst: dict, src: dict) -> None:
    """A later, whole version of an object: its values win, except an empty one over a streamed one."""
    for k, v in src.items():
        if v in _EMPTY and dst.get(k) not in _EMPTY:
            continue
        dst[k] = copy.deepcopy(v)


def _slot(items: list, i: int, default: dict) -> dict:
    while len(items) <= i:
        items.append(None)
    if items[i] is None:
        items[i] = default
    return items[i]


class StreamAccumulator:
    def __init__(self, dialect: str):
        self.dialect = dialect
        self.response: dict = {}
        self.choices: dict[int, dict] = {}  # chat
        self.calls: dict[int, dict[int, dict]] = {}  # chat: choice -> tool call index -> call
        self.blocks: dict[int, dict] = {}  # anthropic
        self.items: list = []  # responses
        self.final: dict | None = None

    def add(self, data: dict) -> None:
        if self.dialect == OPENAI_CHAT:
            self._chat(data)
        elif self.dialect == ANTHROPIC:
            self._anthropic(data)
        else:
            self._responses(data)

    # ---- OpenAI chat ----
    def _chat(self, data: dict) -> None:
        if "error" in data:
            self.response["error"] = data["error"]
        # a chunk repeats id, model, created...: the latest value stands
        settle(self.response, {k: v for k, v in data.items() if k not in ("choices", "object", "obfuscation",
                                                                           "error")})
        for ch in data.get("choices") or []:
            i = ch.get("index", 0)
            cur = self.choices.setdefault(i, {"index": i, "message": {"role": "assistant", "content": None},
                                              "finish_reason": None})
            delta = ch.get("delta") or {}
            for tc in delta.get("tool_calls") or []:
                call = self.calls.setdefault(i, {}).setdefault(tc.get("index", 0), {
                    "id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                fn = tc.get("function") or {}
                # id, type and name come whole (some servers repeat them in every piece); arguments in pieces
                settle(call, {k: v for k, v in tc.items() if k not in ("index", "function")})
                settle(call["function"], {k: v for k, v in fn.items() if k != "arguments"})
                call["function"]["arguments"] += fn.get("arguments") or ""
            if delta.get("role"):
                cur["message"]["role"] = delta["role"]
            merge(cur["message"], delta, skip=("tool_calls", "role"))
            merge(cur, {k: v for k, v in ch.items() if k not in ("delta", "index", "finish_reason")})
            if ch.get("finish_reason"):
                cur["finish_reason"] = ch["finish_reason"]

    # ---- Anthropic messages ----
    def _anthropic(self, data: dict) -> None:
        t = data.get("type")
        if t == "message_start":
            self.response = copy.deepcopy(data.get("message") or {})
        elif t == "content_block_start":
            self.blocks[data.get("index", 0)] = copy.deepcopy(data.get("content_block") or {})
        elif t == "content_block_delta":
            b = self.blocks.setdefault(data.get("index", 0), {"type": "text", "text": ""})
            d = data.get("delta") or {}
            kind = d.get("type")
            if kind == "input_json_delta":
                b["_json"] = b.get("_json", "") + (d.get("partial_json") or "")
            elif kind == "citations_delta":
                b.setdefault("citations", []).append(copy.deepcopy(d.get("citation")))
            else:  # text_delta, thinking_delta, signature_delta and any later kind: its fields joined in
                merge(b, d, skip=("type",))
        elif t == "message_delta":
            merge(self.response, data.get("delta") or {})
            if data.get("usage"):
                self.response["usage"] = {**(self.response.get("usage") or {}), **data["usage"]}
            merge(self.response, {k: v for k, v in data.items() if k not in ("type", "delta", "usage")})
        elif t == "message_stop":
            merge(self.response, {k: v for k, v in data.items() if k not in ("type", "reef")})
        elif t == "error":
            self.response["error"] = data.get("error")

    # ---- OpenAI Responses ----
    def _responses(self, data: dict) -> None:
        t, oi = data.get("type") or "", data.get("output_index", 0)
        if t in ("response.created", "response.in_progress", "response.queued"):
            merge(self.response, {k: v for k, v in (data.get("response") or {}).items() if k != "output"})
        elif t == "response.output_item.added":
            self.items += [None] * (oi + 1 - len(self.items))
            self.items[oi] = copy.deepcopy(data.get("item") or {})
        elif t == "response.output_item.done":
            settle(_slot(self.items, oi, {}), data.get("item") or {})
        elif t in ("response.content_part.added", "response.content_part.done"):
            parts = _slot(self.items, oi, {"type": "message"}).setdefault("content", [])
            settle(_slot(parts, data.get("content_index", 0), {}), data.get("part") or {})
        elif t in ("response.output_text.delta", "response.refusal.delta", "response.reasoning_text.delta"):
            key = "refusal" if "refusal" in t else "text"
            parts = _slot(self.items, oi, {"type": "message"}).setdefault("content", [])
            part = _slot(parts, data.get("content_index", 0), {"type": "output_text" if key == "text" else key})
            part[key] = part.get(key, "") + (data.get("delta") or "")
            if data.get("logprobs"):
                part.setdefault("logprobs", []).extend(copy.deepcopy(data["logprobs"]))
        elif t in ("response.output_text.done", "response.refusal.done", "response.reasoning_text.done"):
            key = "refusal" if "refusal" in t else "text"
            parts = _slot(self.items, oi, {"type": "message"}).setdefault("content", [])
            _slot(parts, data.get("content_index", 0), {})[key] = data.get(key, "")
        elif t == "response.output_text.annotation.added":
            parts = _slot(self.items, oi, {"type": "message"}).setdefault("content", [])
            _slot(parts, data.get("content_index", 0), {}).setdefault("annotations", []).append(
                copy.deepcopy(data.get("annotation")))
        elif t in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            key = "arguments" if "function" in t else "input"
            item = _slot(self.items, oi, {})
            item[key] = (item.get(key) or "") + (data.get("delta") or "")
        elif t in ("response.function_call_arguments.done", "response.custom_tool_call_input.done"):
            key = "arguments" if "function" in t else "input"
            _slot(self.items, oi, {})[key] = data.get(key, "")
        elif t in ("response.reasoning_summary_part.added", "response.reasoning_summary_part.done"):
            summary = _slot(self.items, oi, {"type": "reasoning"}).setdefault("summary", [])
            settle(_slot(summary, data.get("summary_index", 0), {}), data.get("part") or {})
        elif t == "response.reasoning_summary_text.delta":
            summary = _slot(self.items, oi, {"type": "reasoning"}).setdefault("summary", [])
            part = _slot(summary, data.get("summary_index", 0), {"type": "summary_text", "text": ""})
            part["text"] = part.get("text", "") + (data.get("delta") or "")
        elif t == "response.reasoning_summary_text.done":
            summary = _slot(self.items, oi, {"type": "reasoning"}).setdefault("summary", [])
            _slot(summary, data.get("summary_index", 0), {"type": "summary_text"})["text"] = data.get("text", "")
        elif t in ("response.completed", "response.incomplete", "response.failed"):
            self.final = copy.deepcopy(data.get("response") or {})
        elif t == "error":
            self.response["error"] = {k: v for k, v in data.items() if k not in ("type", "sequence_number")}

    def result(self) -> dict:
        if self.dialect == OPENAI_CHAT:
            if not self.response and not self.choices:
                return {}
            choices = []
            for i in sorted(self.choices):
                ch = self.choices[i]
                if self.calls.get(i):
                    ch["message"]["tool_calls"] = [self.calls[i][k] for k in sorted(self.calls[i])]
                choices.append(ch)
            return {**self.response, "object": "chat.completion", "choices": choices}
        if self.dialect == ANTHROPIC:
            if not self.response:
                return {}
            blocks = []
            for i in sorted(self.blocks):
                b = dict(self.blocks[i])
                if "_json" in b:
                    raw = b.pop("_json")
                    try:
                        b["input"] = orjson.loads(raw) if raw else {}
                    except orjson.JSONDecodeError:
                        b["input"] = raw  # what the provider sent, even when it is not JSON
                blocks.append(b)
            return {**self.response, "content": blocks}
        out = {**self.response, **{k: v for k, v in (self.final or {}).items() if k != "output"}}
        if not out:
            return {}
        final_items = (self.final or {}).get("output") or []
        items = []
        for k in range(max(len(self.items), len(final_items))):
            mine = self.items[k] if k < len(self.items) else None
            theirs = final_items[k] if k < len(final_items) else None
            if mine is None:
                mine = copy.deepcopy(theirs)
            elif isinstance(theirs, dict):
                fill(mine, theirs)
            if mine is not None:
                items.append(mine)
        out["output"] = items
        return out
