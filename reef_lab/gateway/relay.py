"""One call through the upstream relay: the provider's dialect chosen, the body translated when it differs from the
client's, the answer (whole or streamed) translated back, and every call recorded.

The record holds what the client sent (`request`, in its `dialect`) and what the client got (`response`, in the
same dialect), so the learning side reads one dialect per record whichever provider answered. A translated call
also keeps the provider's side in `metadata.upstream`: its dialect, HTTP status, its answer as it came (a stream
accumulated), and `dropped`, what the provider's dialect could not carry. Same-dialect calls pass bodies and
events through untouched, as before.
"""

from __future__ import annotations

from typing import Iterator

import orjson

from reef_lab.errors import UpstreamError
from reef_lab.gateway import episodes, unanswered
from reef_lab.wire import PATHS, answers, dialects
from reef_lab.wire.accumulate import StreamAccumulator
from reef_lab.gateway.replies import RECEIPT_HEADER, Reply, StreamReply, release_header_values
from reef_lab.records.record import inference_record
from reef_lab.wire.translate import Translation, error_object



def encode(name: str | None, obj) -> bytes:
    return dialects.sse(obj, name) if obj != "[DONE]" else b"data: [DONE]\n\n"


class RelayCall:
    """One call of `engine` (a Relay), recorded in `store` (the primary's RecordStore or a relay worker's log).
    `components`: a composite release's, named in the answer's headers; `caller`: the id of the client's token, kept
    on the record (reef_lab/tenants.py)."""

    def __init__(self, engine, store, dialect: str, body: dict, name: str, tags: dict, headers: dict, sent: dict,
                 release: str, t0: float, components: dict | None = None, caller: str | None = None):
        self.engine, self.store, self.caller = engine, store, caller
        self.dialect, self.body, self.name, self.tags = dialect, body, name, tags
        self.headers, self.release, self.t0 = headers, release, t0
        self.release_headers = release_header_values(release, components)
        upstream = engine.upstream_dialect or dialect
        self.tr = Translation(dialect, upstream, sent) if upstream != dialect else None
        self.upstream = upstream
        self.path, self.sent = PATHS[upstream], (self.tr.body if self.tr else sent)
        self.episode = episodes.detect(headers, body)  # [episodes hook]
        self.session = {episodes.EPISODE_HEADER: self.episode} if self.episode else {}

    def record(self, response, error: str | None, upstream_status: int | None = None, upstream_response=None,
               status: str | None = None):
        """`status` defaults to ok, or error with an error; an upstream 4xx is `refused` (unanswered.py)."""
        meta = None
        if self.tr is not None:
            meta = {"upstream": {"dialect": self.upstream, "status": upstream_status, "response": upstream_response,
                                 "dropped": self.tr.dropped}}
        if status is None:
            status = "ok" if not error else "refused" if upstream_status and 400 <= upstream_status < 500 \
                else "error"
        rec = inference_record(self.name, self.dialect, self.body, self.tags, response, self.t0,
                               release_id=self.release, status=status, error=error, metadata=meta,
                               episode=self.episode, caller=self.caller)
        self.store.append([rec])
        if status == "refused":
            unanswered.log.info("refused %s call in scenario %s: the provider answered HTTP %s (record %s)",
                                self.dialect, self.name, upstream_status, rec.id)
        return rec

    def cancelled(self, partial, upstream_status: int | None = None, upstream_partial=None) -> None:
        """The client closed the stream: record what came until then."""
        reason = "the client closed the stream before its end"
        rec = self.record(partial, reason, upstream_status, upstream_partial, status="cancelled")
        unanswered.log_cancelled(self.name, self.dialect, rec.id, reason)

    def run(self) -> Reply | StreamReply:
        engine = self.engine
        try:
            if self.body.get("stream"):
                up, events = engine.open_stream(self.path, self.sent, self.headers)
            else:
                up, events = engine.forward(self.path, self.sent, self.headers), None
        except UpstreamError as e:
            self.record(None, e.message)
            raise
        if events is not None:
            gen = self._stream(events) if self.tr is None else self._translated_stream(events, up.status)
            return StreamReply(gen, headers={**self.release_headers, **self.session, **up.headers})
        try:
            resp = orjson.loads(up.body)
        except orjson.JSONDecodeError:
            resp = None
        raw = resp if resp is not None else {"raw": up.body[:65536].decode(errors="replace")}
        if up.status < 300 and not isinstance(resp, dict):
            what = "a body that is not JSON" if resp is None else f"JSON that is not an object ({type(resp).__name__})"
            rec = self.record(raw, f"the upstream provider answered HTTP {up.status} with {what}", up.status, raw)
            raise UpstreamError(f"the upstream provider answered HTTP {up.status} with {what}; the call is record "
                                f"{rec.id}")
        body, content_type = up.body, up.content_type
        if self.tr is not None:
            mine = self.tr.answer(resp) if up.status < 300 else error_object(self.dialect, up.status, up.body)
            body, content_type = orjson.dumps(mine), "application/json"
            rec = self.record(mine, None if up.status < 300 else f"upstream answered HTTP {up.status}", up.status, raw)
        else:
            rec = self.record(raw, None if up.status < 300 else f"upstream answered HTTP {up.status}",
                              up.status if up.status >= 400 else None)
        return Reply(up.status, body, content_type, {RECEIPT_HEADER: rec.id, **self.release_headers, **self.session,
                                                     **up.headers}, record=rec.to_dict())

    def _reef(self, rec) -> dict:
        return {"agent_record_id": rec.id, "release_id": self.release}

    def _stream(self, events) -> Iterator[bytes]:
        """Same dialect: events pass as they are; the final one is held back to carry the receipt."""
        acc = StreamAccumulator(self.dialect)
        final, final_event, error = None, None, None
        try:
            for ev in events:
                event_name, data = answers.parse_sse(ev)
                if data == "[DONE]":
                    break
                try:
                    obj = orjson.loads(data) if data else None
                except orjson.JSONDecodeError:
                    obj = None
                if isinstance(obj, dict):
                    acc.add(obj)
                    if answers.is_final_event(obj):
                        final, final_event = obj, event_name
                        continue
                yield ev
        except UpstreamError as e:
            error = e.message
        except GeneratorExit:  # the client left mid-stream
            self.cancelled(acc.result())
            raise
        rec = self.record(acc.result(), error)
        reef = self._reef(rec)
        if error:
            yield dialects.error_event(self.dialect, error, reef)
        else:
            yield from answers.receipt_end(self.dialect, acc.response, final, final_event, reef)

    def _translated_stream(self, events, status: int) -> Iterator[bytes]:
        """Provider events translated one by one as they arrive; the client's last event carries the receipt."""
        st = self.tr.stream()
        theirs, mine = StreamAccumulator(self.upstream), StreamAccumulator(self.dialect)
        error, held = None, []
        try:
            for ev in events:
                event_name, data = answers.parse_sse(ev)
                if data == "[DONE]":
                    obj = "[DONE]"
                else:
                    try:
                        obj = orjson.loads(data) if data else None
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(obj, dict):
                        theirs.add(obj)
                for name, out in st.feed(event_name, obj):
                    if isinstance(out, dict):
                        mine.add(out)
                    if st.failure is not None:
                        held.append((name, out))
                    else:
                        yield encode(name, out)
                if st.failure is not None or obj == "[DONE]":
                    break
            if st.failure is None:
                for name, out in st.end():
                    if isinstance(out, dict):
                        mine.add(out)
                    yield encode(name, out)
        except UpstreamError as e:
            error = e.message
        except GeneratorExit:  # the client left mid-stream
            self.cancelled(mine.result(), status, theirs.result())
            raise
        if error is None and st.failure is None and not st.finished:
            error = "the upstream stream ended before its last event"
        if error is None and st.failure is None:
            held = st.final()
            for _, out in held:
                if isinstance(out, dict):
                    mine.add(out)
        problem = error or (f"upstream stream failed: {st.failure.message}" if st.failure else None)
        rec = self.record(mine.result(), problem, status, theirs.result())
        reef = self._reef(rec)
        if error is not None:
            yield dialects.error_event(self.dialect, error, reef)
            return
        for k, (name, out) in enumerate(held):  # the receipt rides on the first closing event
            yield encode(name, {**out, "reef": reef} if k == 0 and isinstance(out, dict) else out)
