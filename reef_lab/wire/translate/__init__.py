"""Translation between the three provider dialects, for the upstream relay: a client speaking one (Claude Code:
Anthropic messages; Codex: OpenAI Responses; most SDKs: OpenAI chat) in front of a provider speaking another
(vLLM, SGLang, llama.cpp: OpenAI chat). The same readers, with `strict=True`, read every request generation serves
(reef_lab/wire/dialects.py).

Each dialect is read into one neutral form (ir.py) and written from it: requests, answers, event streams (translated
event by event as they arrive) and errors. What a target dialect cannot carry is either refused with a 400 naming it
(images where the target takes none, documents, server-side state) or, when it has no bearing on what the provider
generates (cache hints, metadata, a hosted tool the provider cannot run), left out and listed in `dropped`, which
the record keeps. docs/relay.md has the mapping tables.

    tr = Translation(client_dialect, upstream_dialect, client_body)
    tr.body                 # the request in the provider's dialect
    tr.answer(obj)          # the provider's answer in the client's dialect
    tr.stream()             # a StreamTranslator: provider events in, client events out
    error_object(dialect, status, provider_body)
"""

from __future__ import annotations

from reef_lab.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from reef_lab.wire.translate import anthropic, chat, responses, responses_stream
from reef_lab.wire.translate.common import ANTHROPIC_ERROR_TYPES, OPENAI_ERROR_TYPES, error_message
from reef_lab.wire.translate.ir import Failure, Finish

MODULES = {ANTHROPIC: anthropic, OPENAI_CHAT: chat, OPENAI_RESPONSES: responses}
STREAMS = {ANTHROPIC: (anthropic.Reader, anthropic.Writer), OPENAI_CHAT: (chat.Reader, chat.Writer),
           OPENAI_RESPONSES: (responses_stream.Reader, responses_stream.Writer)}  # (reader, writer) classes


class Translation:
    """One relayed call from a client's dialect to the provider's."""

    def __init__(self, client: str, upstream: str, body: dict):
        self.client, self.upstream = client, upstream
        self.conv = MODULES[client].parse_request(body)
        self.body = MODULES[upstream].build_request(self.conv)

    @property
    def dropped(self) -> list[str]:
        return self.conv.dropped

    def answer(self, obj: dict) -> dict:
        return MODULES[self.client].build_answer(MODULES[self.upstream].parse_answer(obj), self.conv)

    def stream(self) -> StreamTranslator:
        return StreamTranslator(STREAMS[self.upstream][0](), STREAMS[self.client][1](self.conv))


class StreamTranslator:
    """Provider events in (event name, parsed data: a dict, or "[DONE]"), client events out as (event name or
    None, object or "[DONE]"). `final()` gives the client's last event(s); `failure`/`finished` say how the
    provider's stream ended."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.failure: Failure | None = None
        self.finished = False

    def feed(self, name: str | None, obj) -> list[tuple[str | None, object]]:
        return self._write(self.reader.feed(name, obj))

    def end(self) -> list[tuple[str | None, object]]:
        """The provider's stream ended: what its reader still holds (a chat stream's last blocks)."""
        return self._write(self.reader.end())

    def _write(self, events: list) -> list:
        out = []
        for ev in events:
            if self.failure is not None:
                break
            if isinstance(ev, Failure):
                self.failure = ev
            elif isinstance(ev, Finish):
                self.finished = True
            out += self.writer.write(ev)
        return out

    def final(self) -> list[tuple[str | None, object]]:
        return self.writer.close()


def error_type(dialect: str, status: int) -> str:
    if dialect == ANTHROPIC:
        return ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return OPENAI_ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_object(dialect: str, status: int, provider_body: bytes) -> dict:
    """A provider's error answer as the client's dialect spells an error, with the provider's message."""
    message, _ = error_message(provider_body)
    return MODULES[dialect].error_body(status, f"upstream provider: {message}", error_type(dialect, status))
