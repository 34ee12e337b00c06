"""One call of an engine that generates its own tokens: the request read from the client's dialect, the answer
(whole or streamed) written back in it, and one record however the call ends.

The counterpart of relay.py's `RelayCall` for a Generator engine. The record holds the body as the client sent it,
the token ids and logprobs of the answer and the release that produced them. A call that fails is recorded with its
error, and one that the client leaves (a hang-up, a closed stream) as `cancelled` with the text sent so far.
"""

from __future__ import annotations

import time
from concurrent.futures import CancelledError

import orjson

from reef_lab.engines.base import GenerationStream, Generator
from reef_lab.errors import BadRequest, ReefError
from reef_lab.gateway import episodes, unanswered
from reef_lab.wire import dialects
from reef_lab.records.record import inference_record
from reef_lab.gateway.replies import RECEIPT_HEADER, Reply, StreamReply, release_header_values


class GenerationCall:
    """One call of `engine`, recorded in `store`. `sent` is the body with the scenario's harness applied (what the
    engine reads); `body` is what the client sent (what the record keeps). `label`: the release named on the record
    and header when a harness or composite release serves the scenario (else the engine's); `release`: an in-process
    caller's explicit release, which then names the record too; `components`: a composite release's, named in the
    answer's headers; `caller`: the id of the client's token (reef_lab/tenants.py)."""

    def __init__(self, engine: Generator, store, dialect: str, body: dict, name: str, tags: dict, sent: dict,
                 label: str | None, components: dict | None, release: str | None, kind: str,
                 episode: str | None = None, caller: str | None = None):
        self.engine, self.store, self.caller = engine, store, caller
        self.dialect, self.body, self.name, self.tags, self.kind = dialect, body, name, tags, kind
        self.components, self.episode = components, episode
        self.conv = dialects.read_request(dialect, sent)  # the answer is written from it too (wire/answers.py)
        self.req = dialects.chat_request(self.conv)
        self.req.scenario = name
        if release is not None:
            self.req.release, label = release, release
        self.label = label
        self.model = body.get("model") if isinstance(body.get("model"), str) else engine.model_name
        self.rid, self.created, self.t0 = dialects.new_response_id(dialect), dialects.now(), time.perf_counter()
        self.dropped = {"dropped": self.req.dropped} if self.req.dropped else {}  # hosted tools the model did not see
        self.session = {episodes.EPISODE_HEADER: episode} if episode else {}
        self.sent_text: list[str] = []  # the text deltas a stream has sent: what a cancelled record keeps
        self.record_id: str | None = None  # once a record is written (one record per call, however it ends)
        self.handle: GenerationStream | None = None  # the engine's stream, once submitted

    def run(self) -> Reply | StreamReply:
        try:
            self.handle = self.engine.submit(self.req)
        except ValueError as e:  # the engine refuses the request itself (sampling values, prompt too long)
            raise BadRequest(str(e)) from None
        if not self.body.get("stream"):
            gen, rec, resp = self.finish()
            return Reply(200, orjson.dumps(resp), headers={
                RECEIPT_HEADER: rec.id, **release_header_values(self.label or gen.release_id, self.components),
                **self.session}, record=rec.to_dict())
        return StreamReply(self._events(), headers={
            **release_header_values(self.label or self.handle.release_id, self.components), **self.session},
            cancel=self.handle.cancel)

    def _append(self, rec) -> None:
        self.store.append([rec])
        self.record_id = rec.id

    def cancelled(self, reason: str) -> str:
        """[episodes hook] The client left: record what it was sent until then, never to be trained on."""
        handle = self.handle
        rec = inference_record(self.name, self.dialect, self.body, self.tags, None, self.t0, self.kind,
                               status="cancelled", error=reason, release_id=self.label or handle.release_id,
                               episode=self.episode, caller=self.caller, prompt_token_ids=list(handle.prompt_ids),
                               metadata={"generated_text": "".join(self.sent_text), **self.dropped})
        self._append(rec)
        unanswered.log_cancelled(self.name, self.dialect, rec.id, reason)
        return rec.id

    def finish(self):
        """Wait for the generation; record it (or its failure) and return (generation, record, response)."""
        try:
            gen = self.handle.result()
        except CancelledError as e:  # the client left (server/httpd.py's hang-up watch cancelled it)
            record_id = self.cancelled(str(e) or "cancelled by its caller")
            raise ReefError(f"generation cancelled: the client left (record {record_id})") from e
        except Exception as e:
            rec = inference_record(self.name, self.dialect, self.body, self.tags, None, self.t0, self.kind,
                                   status="error", error=f"{type(e).__name__}: {e}",
                                   release_id=self.label or self.handle.release_id, episode=self.episode,
                                   caller=self.caller)
            self._append(rec)
            err = ReefError(f"generation failed: {e} (record {rec.id})")
            if isinstance(e, ReefError):  # e.g. the engine went down: 503 with its retry hint
                err.status, err.type, err.headers = e.status, e.type, e.headers
            raise err from e
        req = self.req
        resp = dialects.render(self.dialect, gen, self.model, self.rid, self.created, req.tool_use, self.conv)
        rec = inference_record(self.name, self.dialect, self.body, self.tags, resp, self.t0, self.kind,
                               release_id=self.label or gen.release_id, prompt_token_ids=gen.prompt_token_ids,
                               token_ids=gen.token_ids, logprobs=gen.logprobs, episode=self.episode,
                               caller=self.caller,
                               metadata={**(dialects.tool_record(self.dialect, gen, self.rid, req.tool_use) or {}),
                                         **self.dropped} or None)
        self._append(rec)
        return gen, rec, resp

    def _receipt(self):
        """The stream's last event waits here: (generation, record id)."""
        gen, rec, _ = self.finish()
        return gen, rec.id

    def _deltas(self):
        try:
            for delta in self.handle:
                self.sent_text.append(delta)
                yield delta
        except Exception:  # noqa: BLE001 - handle.result() raises it again in finish(), which records it
            return

    def _events(self):
        done = False
        try:
            prompt_tokens = len(self.handle.prompt_ids)
            yield from dialects.stream(self.dialect, self._deltas(), self._receipt, self.model, self.rid, self.created,
                                       prompt_tokens, self.req.tool_use, self.conv)
            done = True
        except ReefError as e:  # generation failed mid-stream: the record holds the error, the client too
            done = True
            yield dialects.error_event(self.dialect, e.message)
        finally:
            if not done:
                self.handle.cancel()
                if self.record_id is None:  # the client closed the stream (the server closed this generator)
                    self.cancelled(f"the client closed the stream after {len(''.join(self.sent_text))} characters")
