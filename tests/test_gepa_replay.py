"""A GEPA search with the real SmolLM2 model, recorded once (tests/fixtures/record_gepa_cassette.py) and replayed:
the same prompts reach the same outcome without a model, and a prompt the cassette has not seen fails loudly."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reef_lab.engines.lm import ReplayLM, UnseenCall

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))

import record_gepa_cassette as rec  # noqa: E402


def test_replayed_search_reaches_the_recorded_outcome(tmp_path):
    search = rec.build(ReplayLM(rec.CASSETTE), tmp_path)
    search.run(progress=False)
    expected = json.loads(rec.EXPECTED.read_text())
    got = rec.outcome(search, tmp_path)
    assert got == expected
    assert "accepted" in got["outcomes"] and len(got["candidates"]) >= 2  # the recording kept a real child
    for ev in (json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()):
        if ev["event"] == "iteration" and "child_scores" in ev:
            assert (ev["outcome"] == "accepted") == (sum(ev["child_scores"]) > sum(ev["parent_scores"]))


def test_a_changed_prompt_is_an_unseen_call(tmp_path, monkeypatch):
    monkeypatch.setattr(rec, "SEED_HARNESS", {**rec.SEED_HARNESS, "rules.md": "Be precise."})
    search = rec.build(ReplayLM(rec.CASSETTE), tmp_path)
    with pytest.raises(UnseenCall, match="record it again"):
        search.run(progress=False)
