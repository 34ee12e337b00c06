"""LM calls recorded once and replayed: the same answers without the model, and a loud failure on an unseen call."""

from __future__ import annotations

import pytest

from reef_lab.engines.lm import OpenAICompatLM, RecordingLM, ReplayLM, UnseenCall


def test_record_then_replay_against_a_provider(stub_url, tmp_path):
    cassette = tmp_path / "calls.jsonl"
    live = RecordingLM(OpenAICompatLM(stub_url, "m"), cassette)
    a = live.complete([{"role": "user", "content": "first"}], temperature=0)
    b = live.complete([{"role": "user", "content": "second"}], temperature=0, max_tokens=5)
    assert a == "echo: first" and b == "echo: second"
    replay = ReplayLM(cassette)
    assert replay.complete([{"role": "user", "content": "first"}], temperature=0) == a
    assert replay.complete([{"role": "user", "content": "second"}], temperature=0, max_tokens=5) == b
    with pytest.raises(UnseenCall, match="'third'"):
        replay.complete([{"role": "user", "content": "third"}], temperature=0)
    with pytest.raises(UnseenCall):  # same messages, other parameters: another call
        replay.complete([{"role": "user", "content": "first"}], temperature=1)


def test_provider_errors_say_what_happened(stub_url):
    with pytest.raises(RuntimeError, match="HTTP 500"):
        OpenAICompatLM(stub_url, "m").complete([{"role": "user", "content": "!500"}])
