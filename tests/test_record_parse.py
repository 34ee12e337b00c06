"""Imported records are a typed parse (Record.from_client against CLIENT_FIELDS), not hand checks in the gateway:
every field a client may set is listed with what it must be, and a value that does not fit is refused naming it."""

from __future__ import annotations

import math

import pytest

from reef_lab.errors import BadRequest
from reef_lab.records.record import CLIENT_FIELDS, Record, content_hash

GOOD = {"id": "imp-1", "scenario": "s", "kind": "inference", "dialect": "openai.chat", "created_at": 1.7e9,
        "request": {"messages": []}, "response": {"x": 1}, "prompt_token_ids": [5], "token_ids": [1, 2],
        "logprobs": [-0.1, -2], "release_id": "s:v1", "tags": {"a": "b"}, "timing": {"total_ms": 3},
        "references": [], "score": 1, "feedback": {"why": "ok"}, "metadata": [1], "status": "ok", "error": None,
        "episode": "session-1"}


def test_a_whole_record_parses_with_its_types():
    rec = Record.from_client(GOOD)
    assert (rec.id, rec.scenario, rec.kind, rec.token_ids, rec.logprobs, rec.score) == \
        ("imp-1", "s", "inference", [1, 2], [-0.1, -2.0], 1.0)
    assert isinstance(rec.score, float) and all(isinstance(x, float) for x in rec.logprobs)
    assert rec.content_hash == content_hash(rec) and rec.created_at == 1.7e9 and rec.episode == "session-1"
    assert set(GOOD) | {"context"} == set(CLIENT_FIELDS)  # every field a client may set, and only those
    report = Record.from_client({"id": "imp-2", "kind": "report", "context": "It is 7.", "references": []}, "s")
    assert report.context == "It is 7." and report.content_hash != Record.from_client(
        {"id": "imp-2", "kind": "report", "references": []}, "s").content_hash
    with pytest.raises(BadRequest, match="'context' is a report's field"):
        Record.from_client({**GOOD, "context": "It is 7."})


def test_defaults_fill_what_a_client_leaves_out():
    rec = Record.from_client({}, default_scenario="dflt")
    assert (rec.scenario, rec.kind, rec.dialect, rec.status, rec.tags, rec.references) == \
        ("dflt", "inference", "", "ok", {}, [])
    assert rec.id.startswith("rec_") and rec.created_at > 0


@pytest.mark.parametrize("key,value,words", [
    ("kind", "bogus", "'kind' must be one of"), ("kind", {"a": 1}, "'kind'"), ("dialect", "x", "'dialect'"),
    ("created_at", 0, "positive unix time"), ("created_at", math.inf, "positive unix time"),
    ("created_at", True, "'created_at'"), ("token_ids", [2**31], "token ids"), ("token_ids", [True], "token ids"),
    ("prompt_token_ids", [-1], "token ids"), ("logprobs", [math.nan, 0], "finite numbers"),
    ("release_id", ["x"], "'release_id'"), ("episode", "a b", "an episode id"), ("tags", {"a": 1}, "object of strings"), ("timing", 3, "'timing'"),
    ("references", "x", "list of receipts"), ("score", "1", "finite number"), ("score", True, "finite number"),
    ("feedback", 5, "string or an object"), ("status", 1, "'status'"), ("id", "a b", "record id"),
    ("scenario", "bad name", "scenario name"), ("nope", 1, "unknown field(s) ['nope']")])
def test_a_field_that_does_not_fit_is_named(key, value, words):
    with pytest.raises(BadRequest) as e:
        Record.from_client({**GOOD, key: value})
    assert words in e.value.message, e.value.message


def test_logprobs_need_one_entry_per_token_and_a_long_value_is_cut_short():
    with pytest.raises(BadRequest, match="one entry per token"):
        Record.from_client({**GOOD, "logprobs": [-0.1]})
    with pytest.raises(BadRequest) as e:
        Record.from_client({**GOOD, "status": 10**200})
    assert len(e.value.message) < 120
    with pytest.raises(BadRequest, match="must be an object"):
        Record.from_client(["not", "a", "record"])
