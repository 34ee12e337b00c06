"""An engine that fails mid-generation: the client gets the dialect's error, the failure is a record."""

import json

import polars as pl
import pytest
import requests

from reef_lab.engines.base import Generation, Generator


class Boom(RuntimeError):
    pass


class FailingStream:
    release_id, prompt_ids = "base", [1]

    def __init__(self):
        self.cancelled = False

    def __iter__(self):
        yield "partial "
        raise Boom("the model fell over")

    def result(self, timeout=None) -> Generation:
        raise Boom("the model fell over")

    def cancel(self):
        self.cancelled = True


class FailingEngine(Generator):
    model_name, release_id = "failing", "base"

    @classmethod
    def from_config(cls, cfg):
        return cls()

    def release_for(self, scenario):
        return "base"

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


def test_full_disk_is_503_without_a_receipt_and_serving_goes_on(proxy, monkeypatch):
    """A record that cannot be written gets no receipt (503 naming the cause); once the disk takes writes again,
    so does the server, and the store holds exactly the acknowledged records."""
    import errno
    import os

    store, real_pwrite = proxy.gateway.store, os.pwrite
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ok = requests.post(proxy.url + "/v1/chat/completions", headers={"x-reef-scenario": "disk"}, json=chat)
    assert ok.status_code == 200

    def full(fd, data, offset):
        if fd == store._log.fd:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", full)
    r = requests.post(proxy.url + "/v1/chat/completions", headers={"x-reef-scenario": "disk"}, json=chat)
    assert r.status_code == 503 and "x-reef-agent-record-id" not in r.headers
    assert "No space left on device" in r.json()["error"]["message"]
    rep = requests.post(proxy.url + "/reef/report", headers={"x-reef-scenario": "disk"},
                        json={"score": 1, "references": [ok.headers["x-reef-agent-record-id"]]})
    assert rep.status_code == 503 and "No space left on device" in rep.json()["error"]["message"]

    monkeypatch.setattr(os, "pwrite", real_pwrite)  # space again
    again = requests.post(proxy.url + "/v1/chat/completions", headers={"x-reef-scenario": "disk"}, json=chat)
    assert again.status_code == 200
    ids = {x["id"] for x in proxy.gateway.list_records("disk", "inference")["records"]}
    assert ids == {ok.headers["x-reef-agent-record-id"], again.headers["x-reef-agent-record-id"]}
    assert proxy.gateway.store.info()["broken"] is None
    from reef_lab.records.store import scan_records  # the log on disk as a reader after a restart sees it
    on_disk = scan_records(store.folder.parent).filter(pl.col("scenario") == "disk").collect()
    assert set(on_disk["id"]) == ids
