"""Tests for the embedded engine on a tiny random-init Llama with SmolLM2's tokenizer (CPU, a few seconds).

The slow test converts and loads the real SmolLM2 (about a minute): `pytest -m slow tests/test_embedded_engine.py`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
from concurrent.futures import CancelledError
from pathlib import Path

import pytest
import torch

from reef_lab.engines.base import ChatRequest, SamplingParams
from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, EmbeddedEngine, load_model, loading
from reef_lab.engines.embedded.loading import CACHE_METADATA_FILE, _gguf_fingerprint
from reef_lab.engines.embedded.sampling import TextTracker
from reef_lab.errors import EngineUnavailable

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def engine(tiny_model, tokenizer):
    with EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", release_id="r0", max_batch=8) as engine:
        yield engine


def chat(i: int, **params) -> ChatRequest:
    content = f"Question {i}: " + "why " * (i % 5) + "tell me about the sea"
    return ChatRequest([{"role": "user", "content": content}], SamplingParams(**params))


def run_alone(engine, request):
    return engine.submit(request).result(timeout=60)


def run_together(engine, requests):
    streams = [engine.submit(r) for r in requests]
    return [s.result(timeout=60) for s in streams]


def teacher_forced_logprobs(model, generation, temperature: float = 1.0) -> list[float]:
    ids = torch.tensor([generation.prompt_token_ids + generation.token_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    start = len(generation.prompt_token_ids)
    logprobs = torch.log_softmax(logits[start - 1 : -1] / temperature, dim=-1)
    return logprobs.gather(1, torch.tensor(generation.token_ids)[:, None])[:, 0].tolist()


def test_batched_greedy_equals_alone(engine):
    requests = [chat(i, max_tokens=24, temperature=0) for i in range(6)]
    alone = [run_alone(engine, r) for r in requests]
    together = run_together(engine, requests)
    for a, b in zip(alone, together, strict=True):
        assert b.token_ids == a.token_ids
        assert b.text == a.text
        assert b.release_id == "r0"
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
    assert len({tuple(a.token_ids) for a in alone}) > 1, "the tiny model should answer prompts differently"


def test_many_threads_submitting_at_once(engine):
    requests = [chat(i, max_tokens=6, temperature=0) for i in range(12)]
    alone = [run_alone(engine, r) for r in requests[:3]]
    results = [None] * len(requests)

    def submit_and_wait(i):
        results[i] = engine.submit(requests[i]).result(timeout=60)

    threads = [threading.Thread(target=submit_and_wait, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None and len(r.token_ids) == 6 for r in results)
    assert [r.token_ids for r in results[:3]] == [a.token_ids for a in alone]


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(engine):
    request = chat(1, max_tokens=20, temperature=0.8, top_p=0.9, seed=1234)
    alone = run_alone(engine, request)
    others = [chat(i, max_tokens=30, temperature=1.0, seed=None) for i in range(2, 6)]
    together = run_together(engine, others[:2] + [request] + others[2:])
    assert together[2].token_ids == alone.token_ids
    assert together[2].text == alone.text
    reseeded = run_alone(engine, chat(1, max_tokens=20, temperature=0.8, top_p=0.9, seed=99))
    assert reseeded.token_ids != alone.token_ids


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_a_full_forward_pass(engine, tiny_model, temperature):
    requests = [chat(i, max_tokens=16, temperature=temperature, seed=i) for i in range(3)]
    for generation in run_together(engine, requests):
        assert len(generation.logprobs) == len(generation.token_ids) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in generation.logprobs)
        expected = teacher_forced_logprobs(tiny_model, generation, temperature or 1.0)
        assert max(abs(x - y) for x, y in zip(generation.logprobs, expected, strict=True)) < 1e-4


def test_prompt_token_ids_are_the_templated_prompt(engine, tokenizer):
    request = chat(3, max_tokens=2, temperature=0)
    generation = run_alone(engine, request)
    templated = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(generation.prompt_token_ids) == templated
    assert engine.count_tokens(request.messages) == len(generation.prompt_token_ids)


def test_stop_string_cuts_text_and_tokens_consistently(engine, tokenizer):
    reference = run_alone(engine, chat(4, max_tokens=30, temperature=0))
    stop = reference.text[12:15]
    cut = reference.text.find(stop)
    assert cut > 0
    stream = engine.submit(chat(4, max_tokens=30, temperature=0, stop=["never appears", stop]))
    streamed = "".join(stream)
    generation = stream.result(timeout=60)
    assert generation.text == streamed == reference.text[:cut]
    assert generation.finish_reason == "stop"
    assert generation.stop_sequence == stop
    kept = len(generation.token_ids)
    assert generation.token_ids == reference.token_ids[:kept]
    assert generation.logprobs == pytest.approx(reference.logprobs[:kept], abs=1e-5)
    # the kept tokens are exactly those that put the returned text in place
    assert tokenizer.decode(generation.token_ids, skip_special_tokens=True).startswith(generation.text)
    assert len(tokenizer.decode(generation.token_ids[:-1], skip_special_tokens=True)) < len(generation.text)


def test_max_tokens_ends_with_length(engine):
    generation = run_alone(engine, chat(2, max_tokens=7, temperature=0))
    assert generation.finish_reason == "length"
    assert len(generation.token_ids) == len(generation.logprobs) == 7
    assert generation.stop_sequence is None


def test_streamed_deltas_join_to_the_result_text(engine):
    requests = [chat(i, max_tokens=25, temperature=1.0, seed=i) for i in range(5)]
    streams = [engine.submit(r) for r in requests]
    joined = [None] * len(streams)

    def consume(i):
        joined[i] = "".join(streams[i])

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert joined == [s.result(timeout=1).text for s in streams]


def test_a_request_joining_mid_decode_completes_correctly(engine):
    long_request, short_request = chat(0, max_tokens=200, temperature=0), chat(3, max_tokens=5, temperature=0)
    long_alone, short_alone = run_alone(engine, long_request), run_alone(engine, short_request)
    assert long_alone.finish_reason == "length", "the test needs a request that decodes for a while"
    long_stream = engine.submit(long_request)
    next(iter(long_stream))  # the long request is decoding now
    short = engine.submit(short_request).result(timeout=60)
    assert not long_stream.done(), "the short request should finish while the long one is still decoding"
    assert short.token_ids == short_alone.token_ids
    assert long_stream.result(timeout=60).token_ids == long_alone.token_ids


def test_cancel_drops_the_row(engine):
    stream = engine.submit(chat(0, max_tokens=500, temperature=0))
    next(iter(stream))
    stream.cancel()
    with pytest.raises(CancelledError):
        stream.result(timeout=30)
    assert engine.info()["requests_cancelled"] >= 1
    assert run_alone(engine, chat(1, max_tokens=3, temperature=0)).finish_reason == "length"


def test_an_error_in_prefill_reaches_the_caller(engine, tiny_model):
    def boom(module, args, kwargs):
        raise RuntimeError("boom in prefill")

    hook = tiny_model.register_forward_pre_hook(boom, with_kwargs=True)
    try:
        stream = engine.submit(chat(1, max_tokens=5, temperature=0))
        with pytest.raises(RuntimeError, match="boom in prefill"):
            stream.result(timeout=30)
        with pytest.raises(RuntimeError, match="boom in prefill"):
            list(stream)
    finally:
        hook.remove()
    assert run_alone(engine, chat(1, max_tokens=3, temperature=0)).finish_reason == "length"


def test_an_error_in_a_decode_step_fails_the_batch_and_the_engine_recovers(engine, tiny_model):
    started = threading.Event()

    def boom_on_decode(module, args, kwargs):
        if kwargs["input_ids"].shape[1] == 1 and started.is_set():
            raise RuntimeError("boom in decode")

    hook = tiny_model.register_forward_pre_hook(boom_on_decode, with_kwargs=True)
    try:
        streams = [engine.submit(chat(i, max_tokens=400, temperature=0)) for i in range(2)]
        next(iter(streams[0]))
        started.set()
        for stream in streams:
            with pytest.raises(RuntimeError, match="boom in decode"):
                stream.result(timeout=30)
    finally:
        hook.remove()
    assert engine.info()["running"]
    assert run_alone(engine, chat(2, max_tokens=3, temperature=0)).finish_reason == "length"


def test_bad_requests_raise_in_the_caller(engine):
    for params in ({"temperature": -1.0}, {"top_p": 0.0}, {"max_tokens": 0}, {"stop": [""]}):
        with pytest.raises(ValueError):
            engine.submit(chat(0, **params))


def test_info_describes_the_engine(engine):
    info = engine.info()
    assert info["model_name"] == "tiny-llama"
    assert info["release_id"] == engine.release_id == "r0"
    assert info["device"] == "cpu" and info["dtype"] == "float32" and info["max_batch"] == 8
    assert info["params"] > 0 and info["tokens_generated"] > 0 and info["queue_depth"] == 0
    from reef_lab.engines.base import Generator, Relay, ReleaseHost
    assert isinstance(engine, Generator) and isinstance(engine, ReleaseHost) and not isinstance(engine, Relay)


def test_close_fails_waiting_callers_and_refuses_new_requests(tiny_model, tokenizer):
    engine = EmbeddedEngine(tiny_model, tokenizer, "tiny-llama", max_batch=1)
    streams = [engine.submit(chat(i, max_tokens=300, temperature=0)) for i in range(3)]
    next(iter(streams[0]))
    engine.close()
    for stream in streams:  # the gateway answers 503 with retry-after for these, not 500
        with pytest.raises(EngineUnavailable, match="closed"):
            stream.result(timeout=30)
    with pytest.raises(EngineUnavailable, match="closed"):
        engine.submit(chat(0))


def test_text_tracker_never_emits_broken_utf8_or_stop_text(tokenizer):
    text = "Hello wor###ld \U0001f980 caf\u00e9"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split()), "the emoji should span several byte-level tokens"
    cases = [([], text), (["###"], "Hello wor"), (["wor###"], "Hello "), (["\U0001f980"], "Hello wor###ld ")]
    for stop, expected in cases:
        tracker = TextTracker(tokenizer, stop)
        deltas = [tracker.add(i) for i in ids if tracker.stop_at is None]
        if tracker.stop_at is None:
            deltas.append(tracker.finish())
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == tracker.returned_text == expected


def test_load_model_from_a_folder(tiny_model, tokenizer, tmp_path):
    folder = tmp_path / "my-tiny"
    tiny_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    model, loaded_tokenizer, name = load_model(str(folder), tmp_path / "cache")
    assert name == "my-tiny"
    assert len(loaded_tokenizer) == len(tokenizer)
    assert torch.equal(model.lm_head.weight, tiny_model.lm_head.weight)


@pytest.mark.slow
def test_real_smollm2_converts_and_answers(tmp_path):
    engine = EmbeddedEngine.from_path(cache_dir=tmp_path)
    try:
        assert (tmp_path / DEFAULT_MODEL_NAME / "model.safetensors").is_file()
        assert [p.name for p in Path(tmp_path).iterdir()] == [DEFAULT_MODEL_NAME]
        question = [{"role": "user", "content": "What is 2+2?"}]
        request = ChatRequest(question, SamplingParams(max_tokens=32, temperature=0))
        generation = engine.submit(request).result(timeout=120)
        assert "4" in generation.text
        assert generation.finish_reason == "stop" and generation.token_ids[-1] == 2
    finally:
        engine.close()
    _, _, name = load_model(None, tmp_path)  # from the cache now
    assert name == DEFAULT_MODEL_NAME


def test_gguf_cache_is_reused_and_dead_temp_folders_are_cleaned(tmp_path, monkeypatch):
    gguf = tmp_path / "fake.Q4.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    target = tmp_path / "cache" / "fake.Q4"
    target.mkdir(parents=True)
    (target / CACHE_METADATA_FILE).write_text(json.dumps(_gguf_fingerprint(gguf)))
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = target.parent / f".fake.Q4.tmp-{dead.pid}-0123abcd"
    leftover.mkdir()
    mine = target.parent / f".fake.Q4.tmp-{os.getpid()}-0123abcd"
    mine.mkdir()
    converted = []
    monkeypatch.setattr(loading, "_convert_gguf", lambda *args: converted.append(args))
    assert loading._converted_gguf(gguf, target) == target and not converted
    gguf.write_bytes(b"GGUF" + bytes(61))  # another file under the same name: converted again
    loading._converted_gguf(gguf, target)
    assert len(converted) == 1
    loading._remove_dead_temp_folders(target)
    assert not leftover.exists() and mine.exists()
