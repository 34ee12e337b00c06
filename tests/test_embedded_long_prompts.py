"""Long prompts on the embedded engine (issue 30): refused past the context, prefilled in chunks between other
requests' decode steps with the same result as one pass, cancelled between chunks, and a close that does not wait
for a forward pass. On the tiny random Llama of conftest.py (2,048 positions); the ordering cases hold a chosen
forward pass on an event, so they do not depend on how fast a busy machine runs.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

import pytest

from reef_lab.config import ServeConfig
from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import EmbeddedEngine
from reef_lab.engines.embedded.batching import PrefillPacer
from reef_lab.errors import EngineUnavailable

CHUNK = 64


@pytest.fixture(scope="module")
def chunked(tiny_model, tokenizer):
    with EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", max_batch=8, prefill_chunk=CHUNK) as engine:
        yield engine


@pytest.fixture(scope="module")
def whole(tiny_model, tokenizer):
    """The same model with chunking off: every prompt in one forward pass (the behaviour before issue 30)."""
    with EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", max_batch=8, prefill_chunk=0) as engine:
        yield engine


def long_chat(engine, tokens: int, **params) -> ChatRequest:
    """A chat request whose templated prompt has exactly `tokens` tokens."""
    words = " ".join(f"w{i % 97}" for i in range(tokens))
    ids = engine.tokenizer.encode(words, add_special_tokens=False)
    overhead = engine.count_tokens([{"role": "user", "content": ""}])
    content = engine.tokenizer.decode(ids[: tokens - overhead])
    request = ChatRequest([{"role": "user", "content": content}], SamplingParams(**params))
    request.prompt_ids = engine.prompt_ids(request.messages)
    while len(request.prompt_ids) > tokens:  # decode/encode can merge a token or two
        content = content[: content.rfind(" ")]
        request.messages[0]["content"] = content
        request.prompt_ids = engine.prompt_ids(request.messages)
    return request


def short_chat(i: int, **params) -> ChatRequest:
    return ChatRequest([{"role": "user", "content": f"Short question {i}: tell me about the sea"}],
                       SamplingParams(**params))


class Gate:
    """A forward pre-hook that records each pass's shape and holds a chosen one until `go` is set."""

    def __init__(self, model, hold=lambda ids, positions: False):
        self.hold, self.entered, self.go = hold, threading.Event(), threading.Event()
        self.passes: list[tuple[int, int, int, int]] = []  # (batch, new tokens, first position, mask width)
        self.held: tuple[int, int] | None = None  # (first position, tokens) of the pass held
        self._hook = model.register_forward_pre_hook(self._pre, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        ids, positions, mask = kwargs["input_ids"], kwargs["position_ids"], kwargs["attention_mask"]
        self.passes.append((ids.shape[0], ids.shape[1], int(positions[0, 0]), mask.shape[1]))
        if not self.entered.is_set() and self.hold(ids, positions):
            self.held = int(positions[0, 0]), ids.shape[1]
            self.entered.set()
            assert self.go.wait(30), "the test never released the held forward pass"

    def later_chunks(self) -> list[int]:
        """First positions of the passes that continued a long prompt's prefill (all its chunks but the first)."""
        return [p for b, n, p, _ in self.passes if b == 1 and n > 1 and p > 0]

    def remove(self):
        self.go.set()
        self._hook.remove()


def test_a_prompt_over_the_context_is_refused_naming_both_counts(chunked):
    request = long_chat(chunked, 2100, max_tokens=64)
    with pytest.raises(ValueError) as refused:
        chunked.submit(request)
    message = str(refused.value)
    assert f"{len(request.prompt_ids)} tokens" in message and "max_tokens asks for 64" in message
    assert "at most 2048 tokens" in message
    assert chunked.info()["queue_depth"] == 0


def test_a_prompt_that_fits_with_less_room_than_max_tokens_ends_at_the_context(chunked):
    request = long_chat(chunked, 2044, max_tokens=64, temperature=0)
    generation = chunked.submit(request).result(timeout=120)
    assert len(generation.prompt_token_ids) + len(generation.token_ids) == 2048
    assert generation.finish_reason == "length"


@pytest.mark.parametrize("params", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}])
def test_chunked_prefill_equals_a_single_pass(chunked, whole, params):
    request = long_chat(chunked, 1500, max_tokens=24, **params)
    chunks_before = chunked.info()["prefill_chunks"]
    alone = whole.submit(request).result(timeout=120)
    split = chunked.submit(request).result(timeout=120)
    assert chunked.info()["prefill_chunks"] - chunks_before >= 1500 // CHUNK  # it really went in chunks
    assert whole.info()["prefill_chunks"] == 0
    assert split.token_ids == alone.token_ids and split.text == alone.text
    assert max(abs(a - b) for a, b in zip(split.logprobs, alone.logprobs, strict=True)) < 1e-4


def test_a_short_request_finishes_while_a_long_prompt_is_prefilled(chunked, whole, tiny_model):
    long_request = long_chat(chunked, 1500, max_tokens=8, temperature=0)
    short_request = short_chat(1, max_tokens=5, temperature=0)
    expected_long, expected_short = (whole.submit(r).result(timeout=120) for r in (long_request, short_request))
    gate = Gate(tiny_model, hold=lambda ids, positions: ids.shape[1] > 1 and int(positions[0, 0]) == 0)
    try:
        long_stream = chunked.submit(long_request)
        assert gate.entered.wait(30)  # its first chunk is in progress: the short one arrives behind it
        short_stream = chunked.submit(short_request)
        gate.go.set()
        short = short_stream.result(timeout=60)
        assert not long_stream.done(), "the short request should not wait for the whole long prefill"
        long = long_stream.result(timeout=120)
    finally:
        gate.remove()
    assert gate.held[0] == 0 and gate.held[1] <= CHUNK  # what was held was the long prompt's first chunk
    assert short.token_ids == expected_short.token_ids
    assert long.token_ids == expected_long.token_ids  # interleaving changed nothing
    assert max(abs(a - b) for a, b in zip(long.logprobs, expected_long.logprobs, strict=True)) < 1e-4


def test_cancel_during_a_chunked_prefill_stops_after_the_current_chunk(chunked, tiny_model):
    request = long_chat(chunked, 1500, max_tokens=8, temperature=0)
    gate = Gate(tiny_model, hold=lambda ids, positions: ids.shape[1] > 1 and int(positions[0, 0]) > 0)
    try:
        stream = chunked.submit(request)
        assert gate.entered.wait(30)  # the second chunk is in progress
        assert chunked.info()["prefilling_rows"] == 1
        stream.cancel()
        gate.go.set()
        done = sum(gate.held)
        with pytest.raises(CancelledError, match=f"during its prompt's prefill, {done} of 1500 tokens done"):
            stream.result(timeout=60)
        deadline = time.monotonic() + 30
        while chunked.info()["active_rows"] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gate.remove()
    assert chunked.info()["active_rows"] == 0
    assert gate.later_chunks() == [gate.held[0]], "no chunk may run after the one in progress at the cancel"


def test_a_long_row_decodes_apart_from_the_short_ones(chunked, whole, tiny_model):
    """Short rows never carry a long prompt's padding: it decodes in its own lane, the short ones together."""
    long_request = long_chat(chunked, 1200, max_tokens=40, temperature=0)
    shorts = [short_chat(i, max_tokens=6, temperature=0) for i in range(3)]
    expected = [whole.submit(r).result(timeout=120) for r in shorts]
    gate = Gate(tiny_model)
    try:
        long_stream = chunked.submit(long_request)
        next(iter(long_stream))  # it is decoding now
        results = [s.result(timeout=60) for s in [chunked.submit(r) for r in shorts]]
        assert not long_stream.done(), "the short requests should decode while the long one does"
        long_stream.result(timeout=60)
    finally:
        gate.remove()
    decode = [(b, width) for b, n, _, width in gate.passes if n == 1]
    assert any(b == 1 and width > 1200 for b, width in decode), "the long row's own decode steps"
    assert not [(b, w) for b, w in decode if b > 1 and w > 1000], "a short batch padded to the long prompt"
    assert [r.token_ids for r in results] == [e.token_ids for e in expected]


def test_close_answers_callers_without_waiting_for_a_stuck_forward_pass(tiny_model, tokenizer):
    engine = EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", max_batch=4, prefill_chunk=CHUNK)
    request = long_chat(engine, 1500, max_tokens=8, temperature=0)
    gate = Gate(tiny_model, hold=lambda ids, positions: ids.shape[1] > 1)
    try:
        streams = [engine.submit(request) for _ in range(2)] + [engine.submit(short_chat(0, max_tokens=50))]
        assert gate.entered.wait(30)
        started = time.monotonic()
        engine.close(timeout=0.2)
        took = time.monotonic() - started
        for stream in streams:
            with pytest.raises(EngineUnavailable, match="closed"):
                stream.result(timeout=5)
        with pytest.raises(EngineUnavailable):
            engine.submit(short_chat(1))
    finally:
        gate.remove()
    assert took < 10, f"close waited {took:.1f} s for a forward pass it did not need"
    engine._scheduler.thread.join(30)
    assert not engine.info()["running"]


def test_the_pacer_sizes_chunks_to_the_share_of_time():
    pacer = PrefillPacer(chunk=512, share=0.5, min_chunk=16, quiet_s=1.0)
    assert pacer.size(now=0.0) == 512  # nothing else ever ran: full chunks
    pacer.round_done(other_s=0.1, busy=True, now=10.0)
    assert pacer.sharing(10.0) and pacer.size(10.0) == 16  # no speed known yet: the smallest chunk
    pacer.chunk_done(tokens=100, seconds=0.2, shared=True)  # 500 tokens/s
    assert pacer.size(10.0) == 50  # 0.1 s of others' work per round: a chunk of 0.1 s
    pacer.chunk_done(tokens=512, seconds=0.01, shared=False)  # a full-size chunk teaches nothing here
    assert pacer.size(10.0) == 50
    for now in (10.5, 10.7, 10.9):  # rounds with nothing else: still sharing for three rounds or a second
        pacer.round_done(other_s=0.0, busy=False, now=now)
        assert pacer.size(now) == 50
    assert pacer.size(11.5) == 50  # more than a second, but within three rounds
    pacer.round_done(other_s=0.0, busy=False, now=11.5)
    assert pacer.size(11.5) == 512  # quiet for four rounds and over a second: full chunks again
    slow_rounds = PrefillPacer(chunk=512, share=0.5, quiet_s=1.0)
    slow_rounds.round_done(0.1, True, 0.0)
    slow_rounds.round_done(0.0, False, 0.5)
    slow_rounds.round_done(0.0, False, 0.6)
    slow_rounds.round_done(0.0, False, 0.7)
    slow_rounds.round_done(0.0, False, 0.8)
    assert slow_rounds.sharing(0.9)  # four quick rounds, but within a second
    slow = PrefillPacer(chunk=512, share=0.2, min_chunk=16)
    slow.round_done(0.1, True, 0.0)
    slow.chunk_done(100, 1.0, True)  # 100 tokens/s; 0.025 s per round would be 2 tokens
    assert slow.size(0.0) == 16
    never = PrefillPacer(chunk=512, share=1.0)
    never.round_done(0.1, True, 0.0)
    never.chunk_done(100, 1.0, True)
    assert never.size(0.0) == 512


def test_bad_chunking_settings_are_refused(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="prefill_chunk"):
        EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", prefill_chunk=8)
    with pytest.raises(ValueError, match="prefill_share"):
        EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", prefill_share=0)
    with pytest.raises(ValueError, match="prefill_chunk"):
        ServeConfig(prefill_chunk=-1)
    with pytest.raises(ValueError, match="prefill_share"):
        ServeConfig(prefill_share=1.5)
    assert ServeConfig(prefill_chunk=0).prefill_chunk == 0


def test_close_abandons_a_forward_pass_at_its_next_layer(tiny_model, tokenizer):
    """A stopping server does not wait for a long chunk to finish: the pass ends between two layers."""
    engine = EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", max_batch=4, prefill_chunk=CHUNK)
    request = long_chat(engine, 1500, max_tokens=8, temperature=0)
    first, second = tiny_model.model.layers[0], tiny_model.model.layers[1]
    entered, go, after = threading.Event(), threading.Event(), []

    def hold(module, args):
        if threading.current_thread() is engine._scheduler.thread and not entered.is_set():
            entered.set()
            assert go.wait(30)

    hooks = [first.register_forward_pre_hook(hold),
             second.register_forward_pre_hook(lambda m, a: after.append(entered.is_set()))]
    try:
        stream = engine.submit(request)
        assert entered.wait(30)  # the first layer of the first chunk is running
        closing = threading.Thread(target=engine.close, kwargs={"timeout": 60})
        closing.start()
        wait_until = time.monotonic() + 30
        while not engine._scheduler.closed and time.monotonic() < wait_until:
            time.sleep(0.01)
        go.set()
        closing.join(60)
        assert not closing.is_alive() and not engine._scheduler.thread.is_alive()
        with pytest.raises(EngineUnavailable, match="closed"):
            stream.result(timeout=5)
    finally:
        go.set()
        for hook in hooks:
            hook.remove()
    assert after == [], "the second layer ran after the engine was closed"
