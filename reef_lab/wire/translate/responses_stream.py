"""OpenAI Responses event streams read into and written from the neutral stream events (see responses.py for the
requests and answers)."""

from __future__ import annotations

import time

from reef_lab.wire.translate.common import arguments_object, new_id
from reef_lab.wire.translate.ir import (BlockStart, BlockStop, Conversation, Delta, Failure, Finish, Start, Text,
                                           Thinking, ToolCall, Usage)
from reef_lab.wire.translate.responses import (ItemIds, call_item, call_kind, item_parts, new_item_id, response_object,
                                              stop_of, usage_in)


class Reader:
    """Responses events in, neutral events out. Each output item (or each text part of a message) is one block.
    Whatever the streamed items lack, `response.completed` fills in: items it holds that never streamed, text or
    arguments that came only whole in a `.done` event."""

    def __init__(self):
        self.started, self.finished = False, False
        self.blocks: dict[tuple, int] = {}  # (output_index,) or (output_index, content_index) -> block index
        self.text: dict[int, str] = {}  # what each block got so far
        self.open: set[int] = set()
        self.seen_items: set[int] = set()
        self.next, self.calls = 0, 0

    def _start(self, key: tuple, part) -> list:
        i = self.blocks[key] = self.next
        self.next += 1
        self.calls += isinstance(part, ToolCall)
        self.text[i] = ""
        self.open.add(i)
        return [BlockStart(i, part)]

    def _delta(self, key: tuple, text: str) -> list:
        i = self.blocks.get(key)
        if i is None or i not in self.open or not text:
            return []
        self.text[i] += text
        return [Delta(i, text)]

    def _fill(self, key: tuple, whole: str) -> list:
        """The rest of a block's text that only its `.done` event held."""
        i = self.blocks.get(key)
        if i is None or i not in self.open or not isinstance(whole, str) or not whole.startswith(self.text[i]):
            return []
        return self._delta(key, whole[len(self.text[i]):])

    def _close_block(self, key: tuple) -> list:
        i = self.blocks.get(key)
        if i is None or i not in self.open:
            return []
        self.open.discard(i)
        return [BlockStop(i)]

    def _whole_item(self, oi: int, item: dict) -> list:
        """An item that arrived complete (no deltas): its blocks, opened, filled and closed at once."""
        out = []
        for ci, p in enumerate(item_parts(item)):
            key = (oi, ci) if isinstance(p, Text) else (oi,)
            if key in self.blocks:
                continue
            text = p.arguments if isinstance(p, ToolCall) else p.text
            out += self._start(key, ToolCall(p.id, p.name, "", p.custom) if isinstance(p, ToolCall) else
                               type(p)(""))
            out += self._delta(key, text)
            if isinstance(p, Thinking) and p.signature:
                out.append(Delta(self.blocks[key], signature=p.signature))
            out += self._close_block(key)
        self.seen_items.add(oi)
        return out

    def feed(self, name: str | None, obj) -> list:
        if not isinstance(obj, dict):
            return []
        kind, oi = obj.get("type"), obj.get("output_index", 0)
        out = []
        if not self.started and kind not in ("error",):
            self.started = True
            resp = obj.get("response") or {}
            out.append(Start(resp.get("id") or new_id("resp_"), resp.get("model")))
        if kind == "response.output_item.added":
            item = obj.get("item") or {}
            self.seen_items.add(oi)
            if item.get("type") == "reasoning":
                out += self._start((oi,), Thinking(""))
            elif item.get("type") in ("function_call", "custom_tool_call"):
                call = item_parts(item)[0]
                out += self._start((oi,), ToolCall(call.id, call.name, "", call.custom))
                out += self._delta((oi,), call.arguments)
        elif kind == "response.content_part.added":
            part = obj.get("part") or {}
            if part.get("type") in ("output_text", "refusal"):
                key = (oi, obj.get("content_index", 0))
                out += self._start(key, Text(""))
                out += self._delta(key, part.get("text") or part.get("refusal") or "")
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            out += self._delta((oi, obj.get("content_index", 0)), obj.get("delta") or "")
        elif kind in ("response.output_text.done", "response.refusal.done"):
            out += self._fill((oi, obj.get("content_index", 0)), obj.get("text", obj.get("refusal")))
        elif kind == "response.content_part.done":
            key = (oi, obj.get("content_index", 0))
            part = obj.get("part") or {}
            out += self._fill(key, part.get("text", part.get("refusal"))) + self._close_block(key)
        elif kind == "response.reasoning_summary_part.added" and obj.get("summary_index", 0) > 0:
            out += self._delta((oi,), "\n\n")
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta",
                      "response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            out += self._delta((oi,), obj.get("delta") or "")
        elif kind in ("response.function_call_arguments.done", "response.custom_tool_call_input.done"):
            out += self._fill((oi,), obj.get("arguments", obj.get("input")))
        elif kind == "response.output_item.done":
            out += self._item_done(oi, obj.get("item") or {})
        elif kind in ("response.completed", "response.incomplete"):
            out += self._finish(obj.get("response") or {})
        elif kind == "response.failed":
            err = (obj.get("response") or {}).get("error") or {}
            out.append(Failure(err.get("message") or "the provider's response failed", err.get("code") or "api_error"))
        elif kind == "error":
            out.append(Failure(obj.get("message") or (obj.get("error") or {}).get("message") or
                               "the provider's stream failed", obj.get("code") or "api_error"))
        return out

    def _item_done(self, oi: int, item: dict) -> list:
        if oi not in self.seen_items:
            return self._whole_item(oi, item)
        out = []
        kind = item.get("type")
        if kind == "message":
            for ci, c in enumerate(item.get("content") or []):
                if (oi, ci) not in self.blocks and c.get("type") in ("output_text", "refusal"):
                    out += self._start((oi, ci), Text(""))
                out += self._fill((oi, ci), c.get("text", c.get("refusal"))) + self._close_block((oi, ci))
        elif kind in ("reasoning", "function_call", "custom_tool_call"):
            p = item_parts(item)[0]
            out += self._fill((oi,), p.text if isinstance(p, Thinking) else p.arguments)
            if isinstance(p, Thinking) and p.signature and (oi,) in self.blocks:
                out.append(Delta(self.blocks[(oi,)], signature=p.signature))
            out += self._close_block((oi,))
        return out

    def _finish(self, resp: dict) -> list:
        out = []
        for oi, item in enumerate(resp.get("output") or []):
            if oi not in self.seen_items and isinstance(item, dict):
                out += self._whole_item(oi, item)
        for i in sorted(self.open):
            out.append(BlockStop(i))
        self.open.clear()
        self.finished = True
        parts = [p for item in resp.get("output") or [] if isinstance(item, dict) for p in item_parts(item)]
        stop = stop_of(resp, parts)
        if stop == "end" and self.calls:  # the calls streamed, `output` came empty
            stop = "tool_calls"
        return out + [Finish(stop, None, usage_in(resp.get("usage")))]

    def end(self) -> list:
        return []


class Writer:
    """Neutral events in, Responses events out as (event name, object) pairs; `close` gives `response.completed`
    (or `.incomplete`) with every item the stream held (the receipt rides on it)."""

    def __init__(self, conv: Conversation, ids: ItemIds = new_item_id):
        """`ids`: how items are named (generation derives them from the response id: reef_lab.wire.answers)."""
        self.conv, self.ids = conv, ids
        self.messages = self.calls = 0  # items named so far, by kind
        self.id, self.model, self.created = new_id("resp_"), None, int(time.time())
        self.seq = 0
        self.items: list[dict] = []  # the output, in order
        self.block: dict[int, tuple[int, dict]] = {}  # block index -> (output index, item)
        self.text: dict[int, str] = {}
        self.stop, self.usage = "end", Usage()

    def _ev(self, kind: str, **fields) -> tuple[str, dict]:
        self.seq += 1
        return kind, {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _response(self, status: str) -> dict:
        return response_object(self.id, self.model, self.created, status, self.items if status != "in_progress"
                               else [], None if status == "in_progress" else self.usage, self.stop, self.conv)

    def write(self, ev) -> list:
        if isinstance(ev, Start):
            self.model = ev.model
            if ev.id.startswith("resp_"):
                self.id = ev.id
            return [self._ev("response.created", response=self._response("in_progress")),
                    self._ev("response.in_progress", response=self._response("in_progress"))]
        if isinstance(ev, BlockStart):
            return self._start(ev.index, ev.part)
        if isinstance(ev, Delta):
            return self._delta(ev)
        if isinstance(ev, BlockStop):
            return self._close_block(ev.index)
        if isinstance(ev, Finish):
            self.stop, self.usage = ev.stop, ev.usage or Usage()
            return []
        if isinstance(ev, Failure):
            failed = {**self._response("failed"), "error": {"code": "server_error", "message": ev.message}}
            return [self._ev("response.failed", response=failed)]
        return []

    def _start(self, b: int, p) -> list:
        oi = len(self.items)
        self.text[b] = ""
        if isinstance(p, Text):
            item = {"type": "message", "id": self.ids("message", self.messages), "status": "in_progress",
                    "role": "assistant", "content": []}
            self.messages += 1
            self.items.append(item)
            self.block[b] = (oi, item)
            return [self._ev("response.output_item.added", output_index=oi, item=dict(item)),
                    self._ev("response.content_part.added", item_id=item["id"], output_index=oi, content_index=0,
                             part={"type": "output_text", "text": "", "annotations": []})]
        if isinstance(p, Thinking):
            item = {"type": "reasoning", "id": self.ids("reasoning", 0), "summary": []}
            self.items.append(item)
            self.block[b] = (oi, item)
            return [self._ev("response.output_item.added", output_index=oi, item=dict(item)),
                    self._ev("response.reasoning_summary_part.added", item_id=item["id"], output_index=oi,
                             summary_index=0, part={"type": "summary_text", "text": ""})]
        item = call_item(p, self.conv, self.ids(call_kind(p, self.conv), self.calls), "in_progress")
        self.calls += 1
        if item["type"] == "custom_tool_call":  # in progress: empty until its input comes (a local shell call's
            item["input"] = ""  # action comes whole, with its start)
        elif item["type"] == "function_call":
            item["arguments"] = ""
        self.items.append(item)
        self.block[b] = (oi, item)
        return [self._ev("response.output_item.added", output_index=oi, item=dict(item))]

    def _delta(self, ev: Delta) -> list:
        oi, item = self.block.get(ev.index, (None, None))
        if item is None:
            return []
        if ev.signature is not None:
            if item["type"] == "reasoning" and ev.signature:
                item["encrypted_content"] = ev.signature
            return []
        self.text[ev.index] += ev.text
        ids = {"item_id": item["id"], "output_index": oi}
        if item["type"] == "message":
            return [self._ev("response.output_text.delta", **ids, content_index=0, delta=ev.text, logprobs=[])]
        if item["type"] == "reasoning":
            return [self._ev("response.reasoning_summary_text.delta", **ids, summary_index=0, delta=ev.text)]
        if item["type"] in ("custom_tool_call", "local_shell_call"):
            return []  # the provider streams {"input": ...} JSON; the client gets the string whole at the end
        return [self._ev("response.function_call_arguments.delta", **ids, delta=ev.text)]

    def _close_block(self, b: int) -> list:
        oi, item = self.block.pop(b, (None, None))
        if item is None:
            return []
        text, ids = self.text.pop(b), {"item_id": item["id"], "output_index": oi}
        out = []
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            item.update(status="completed", content=[part])
            out += [self._ev("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]),
                    self._ev("response.content_part.done", **ids, content_index=0, part=part)]
        elif item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            out += [self._ev("response.reasoning_summary_text.done", **ids, summary_index=0, text=text),
                    self._ev("response.reasoning_summary_part.done", **ids, summary_index=0, part=part)]
        elif item["type"] == "local_shell_call":
            item["status"] = "completed"
        elif item["type"] == "custom_tool_call":
            unwrapped = arguments_object(text).get("input", text)
            item.update(status="completed", input=unwrapped if isinstance(unwrapped, str) else text)
            out += [self._ev("response.custom_tool_call_input.delta", **ids, delta=item["input"]),
                    self._ev("response.custom_tool_call_input.done", **ids, input=item["input"])]
        else:
            item.update(status="completed", arguments=text)
            out.append(self._ev("response.function_call_arguments.done", **ids, name=item["name"], arguments=text))
        return out + [self._ev("response.output_item.done", output_index=oi, item=dict(item))]

    def close(self) -> list:
        status = "incomplete" if self.stop in ("length", "refusal") else "completed"
        return [self._ev(f"response.{status}", response=self._response(status))]
