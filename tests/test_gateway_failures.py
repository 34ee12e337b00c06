"""An engine that fails mid-generation: the client gets the dialect's error, the failure is a record."""

import json

import pytest
import requests

from reef_lab.engines.base import Generation


class Boom(RuntimeError):
    pass


class FailingStream:
    release_id = "base"

    def __init__(self):
        self.cancelled = False

    def __iter__(self):
        yield "partial "
        raise Boom("the model fell over")

    def result(self, timeout=None) -> Generation:
        raise Boom("the model fell over")

    def cancel(self):
        self.cancelled = True


class FailingEngine:
    relays, model_name, release_id = False, "failing", "base"

    def submit(self, request):
        return FailingStream()

    def count_tokens(self, messages):
        return 1

    def info(self):
        return {"engine": "failing"}

    def close(self):
        pass


@pytest.mark.parametrize("path,body,error_event", [
    ("/v1/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}, None),
    ("/v1/messages", {"model": "m", "stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
     "error"),
])
def test_failure_mid_stream_ends_with_an_error_event_and_a_record(serve, path, body, error_event):
    s = serve(FailingEngine())
    r = requests.post(s.url + path, json=body, headers={"x-reef-scenario": "f"})
    events = [e for e in r.text.split("\n\n") if e.strip()]
    last = events[-1]
    assert (f"event: {error_event}" in last) if error_event else last.startswith("data: {")
    assert "the model fell over" in json.loads(last.split("data: ", 1)[1])["error"]["message"]
    recs = s.gateway.list_records("f", "inference")["records"]
    assert len(recs) == 1 and recs[0]["status"] == "error" and "the model fell over" in recs[0]["error"]


def test_failure_without_stream_is_500_with_the_record_named(serve):
    s = serve(FailingEngine())
    r = requests.post(s.url + "/v1/chat/completions", headers={"x-reef-scenario": "f"},
                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 500 and "generation failed" in r.json()["error"]["message"]
    rec = s.gateway.list_records("f", "inference")["records"][0]
    assert rec["status"] == "error" and rec["agent_record_id"] in r.json()["error"]["message"]
