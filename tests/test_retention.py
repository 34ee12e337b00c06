"""Retention: the policy's decisions, eviction in the store (whole segments and rewrites, pins, a report racing an
eviction, a crash between any two steps), and the gateway around it (learners' and lineage's records kept, status,
log lines, exports, configuration). The soak under retention is tests/test_retention_soak.py (heavy)."""

from __future__ import annotations

import json
import random
import logging
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
import requests
from werkzeug.serving import make_server

from reef_lab.config import parse_serve_config
from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.errors import BadRequest
from reef_lab.gateway.gateway import Gateway
from reef_lab.records.record import Record, new_record_id
from reef_lab.records.retention import (Part, RetentionConfig, RetentionPolicy, Retainer, SegmentStat,
                                        parse_bytes, parse_duration, plan)
from reef_lab.records.store import RecordStore, scan_records
from server.app import create_app

ROOT = Path(__file__).resolve().parents[1]
NOW = 1_000_000.0


# ---- the decision --------------------------------------------------------------------------------------------------
def seg(no, size, **parts):
    """A segment whose parts are name=(rows, newest) (oldest: newest - 0.5)."""
    return SegmentStat(no, size, {k: Part(r, t - 0.5, t) for k, (r, t) in parts.items()})


def test_bytes_limit_keeps_at_least_the_limit_and_exceeds_it_by_less_than_one_segment():
    segs = [seg(i, size, a=(10, NOW - 100 + i)) for i, size in enumerate([300, 100, 250, 400, 200, 150], 1)]
    cfg = RetentionConfig(RetentionPolicy(max_bytes=600))
    drops = plan(segs, {}, cfg, NOW)
    assert drops == {1: None, 2: None, 3: None}  # oldest first
    kept = sum(s.bytes for s in segs if s.no not in drops)
    assert 600 <= kept < 600 + segs[3].bytes  # by less than the oldest segment kept
    # the logs not rolled yet count too (they are never evicted)
    assert plan(segs, {"a": [(NOW, 80)] * 5}, cfg, NOW) == {1: None, 2: None, 3: None, 4: None}
    # nothing over the limit: nothing goes
    assert plan(segs, {}, RetentionConfig(RetentionPolicy(max_bytes=10_000)), NOW) == {}


def test_records_limit_never_evicts_one_of_the_newest():
    segs = [seg(i, 1000, a=(100, NOW - 10 + i)) for i in range(1, 6)]
    drops = plan(segs, {"a": [(NOW, 1)] * 30}, RetentionConfig(RetentionPolicy(max_records=250)), NOW)
    assert drops == {1: None, 2: None}  # 530 -> 330; evicting a third would leave 230 < 250
    assert plan(segs, {}, RetentionConfig(RetentionPolicy(max_records=500)), NOW) == {}


@pytest.mark.parametrize("seed", range(20))
def test_with_several_writers_no_record_among_the_newest_goes(seed):
    """Workers write logs at once, so segments overlap in time: records are simulated one by one and checked."""
    rng = random.Random(seed)
    writers, per_log = rng.randint(1, 3), rng.randint(5, 40)
    logs = [[] for _ in range(writers)]
    segs, times = [], {}  # segment no -> its records' times
    for i in range(rng.randint(50, 600)):
        w = rng.randrange(writers)
        logs[w].append(NOW - 1000 + i)
        if len(logs[w]) == per_log:
            no = len(segs) + 1
            times[no] = logs[w]
            segs.append(SegmentStat(no, 10 * per_log, {"a": Part(per_log, logs[w][0], logs[w][-1])}))
            logs[w] = []
    tail = sorted(t for log in logs for t in log)
    cap = rng.randint(1, 400)
    drops = plan(segs, {"a": [(t, 10) for t in tail]}, RetentionConfig(RetentionPolicy(max_records=cap)), NOW)
    every = sorted([t for ts in times.values() for t in ts] + tail)
    newest = set(every[-cap:])
    assert not newest & {t for no in drops for t in times[no]}
    kept = len(every) - sum(len(times[no]) for no in drops)
    assert kept < max(cap, len(tail)) + writers * per_log  # over by less than one segment per writer


def test_age_evicts_a_segment_once_its_newest_record_is_older():
    segs = [seg(1, 10, a=(5, NOW - 200)), seg(2, 10, a=(5, NOW - 61)), seg(3, 10, a=(5, NOW - 59)),
            seg(4, 10, a=(5, NOW - 1))]
    assert plan(segs, {}, RetentionConfig(RetentionPolicy(max_age=60)), NOW) == {1: None, 2: None}


def test_scenario_limits_take_only_that_scenarios_records():
    segs = [seg(1, 100, a=(10, NOW - 50), b=(10, NOW - 50)), seg(2, 100, a=(20, NOW - 40)),
            seg(3, 100, a=(10, NOW - 30), b=(10, NOW - 30)), seg(4, 100, a=(10, NOW - 5), b=(10, NOW - 5))]
    cfg = RetentionConfig(scenarios={"a": RetentionPolicy(max_records=15)})
    drops = plan(segs, {"a": [(NOW, 2)] * 5}, cfg, NOW)
    # a holds 55 with its log: its parts go oldest first while 15 stay; b is untouched; a segment holding only a
    # goes whole
    assert drops == {1: {"a"}, 2: None, 3: {"a"}}
    # an age override for b with a data-dir limit on top: the data dir's takes whole segments first
    cfg = RetentionConfig(RetentionPolicy(max_records=40), {"b": RetentionPolicy(max_age=20)})
    assert plan(segs, {}, cfg, NOW) == {1: None, 2: None, 3: {"b"}}


def test_scenario_policies_by_name_and_pattern():
    cfg = RetentionConfig.from_mapping(RetentionPolicy(), {"eval-*": {"max_age": "1d"}, "eval-keep": {
        "max_records": 10}, "*": {"max_bytes": "1GB"}})
    assert cfg.policy_for("eval-keep") == RetentionPolicy(max_records=10)  # the exact name first
    assert cfg.policy_for("eval-x") == RetentionPolicy(max_age=86400)  # then patterns in order
    assert cfg.policy_for("chat") == RetentionPolicy(max_bytes=1 << 30)
    for bad, says in [({"x": {}}, "mapping of limits"), ({"x": {"keep": 1}}, "unknown limit"),
                      ({"x": {"max_age": "soon"}}, re.escape("retain_scenarios['x'].max_age")),
                      ({"x": {"max_records": 0}}, "at least 1")]:
        with pytest.raises(ValueError, match=says):
            RetentionConfig.from_mapping(RetentionPolicy(), bad)


def test_sizes_and_durations():
    assert parse_bytes("20GB") == 20 << 30 and parse_bytes("1.5 MB") == 3 << 19 and parse_bytes(4096) == 4096
    assert parse_duration("30d") == 30 * 86400 and parse_duration("90s") == 90 and parse_duration(2.5) == 2.5
    for bad in ("", "-1GB", "12 parsecs", True, "0"):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    with pytest.raises(ValueError, match="duration such as"):
        parse_duration("tomorrow")


# ---- the store -----------------------------------------------------------------------------------------------------
def fill(store, n, scenarios=("a", "b"), kind="inference"):
    out = []
    for i in range(n):
        r = Record(id=new_record_id(), scenario=scenarios[i % len(scenarios)], kind=kind,
                   request={"messages": [{"role": "user", "content": f"q{i}"}]}, response={"content": "x" * 40})
        store.append([r])
        out.append((r.id, r.scenario))
    return out


def check_consistent(store, expect: set[str], gone: set[str]):
    """Every read path sees exactly `expect`; the index names only segments that exist."""
    indexed = set(store._rolled.page(None, None, 0.0, None, None)) | set(store.ids())
    assert indexed == expect
    assert {r["id"] for r in store.get_many(sorted(expect | gone))} == expect
    assert all(store.entry(rid) is None for rid in gone)
    assert set(store.scan().select("id").collect()["id"]) == expect
    assert set(scan_records(store.folder.parent).select("id").collect()["id"]) == expect
    on_disk = {int(p.name[4:10]) for p in store.folder.glob("seg-*.parquet")}
    assert store._rolled.segments() <= on_disk
    for scenario in ("a", "b"):
        assert store.ids(scenario) == sorted(rid for rid in expect if store.entry(rid).scenario == scenario)


def test_eviction_deletes_and_rewrites_segments_and_every_read_agrees(tmp_path):
    st = RecordStore(tmp_path, roll_records=50)
    recs = fill(st, 400)
    st.roll_open_log()
    assert st.info()["segments"] == 8
    cfg = RetentionConfig(RetentionPolicy(max_records=300), {"a": RetentionPolicy(max_records=100)})
    ret = Retainer(st, cfg, set)
    done = ret.run_round()
    # the data dir's limit deletes the two oldest segments (300 left); a's limit then takes a's part of two more
    # (25 of a's records each: 150 -> 100)
    assert (done["segments"], done["rewritten"], done["records"]) == (2, 2, 150)
    a = [rid for rid, sc in recs if sc == "a"]
    expect = set(a[-100:]) | {rid for rid, sc in recs[100:] if sc == "b"}
    gone = {rid for rid, _ in recs} - expect
    check_consistent(st, expect, gone)
    assert ret.status()["by_scenario"] == {"a": {"segments": 4, "records": 100, "bytes": ret.by_scenario["a"]["bytes"]},
                                           "b": {"segments": 2, "records": 50, "bytes": ret.by_scenario["b"]["bytes"]}}
    assert ret.run_round()["records"] == 0  # nothing more is due
    st.close()
    st = RecordStore(tmp_path)  # and after a restart
    check_consistent(st, expect, gone)
    st.close()


def test_pinned_records_stay_and_their_segment_is_rewritten_around_them(tmp_path):
    st = RecordStore(tmp_path, roll_records=50)
    recs = fill(st, 200)
    st.roll_open_log()
    pins = {recs[3][0], recs[60][0], recs[199][0]}
    ret = Retainer(st, RetentionConfig(RetentionPolicy(max_age=60)), lambda: pins, clock=lambda: time.time() + 120)
    done = ret.run_round()
    assert (done["segments"], done["rewritten"], done["pinned"]) == (1, 3, 3)  # segments 1, 2, 4 hold a pin
    check_consistent(st, pins, {rid for rid, _ in recs} - pins)
    assert ret.run_round()["records"] == 0 and ret.last_round["pinned"] == 3  # still pinned, nothing to rewrite
    st.close()


def test_a_report_on_a_record_during_a_round_keeps_it(tmp_path):
    st = RecordStore(tmp_path, roll_records=20)
    recs = fill(st, 20, ("a",))
    st.roll_open_log()
    drop = st.eviction_candidates({1: None})[1]
    st.fence(set(drop))
    st.append([Record(id=new_record_id(), scenario="a", kind="report", score=1.0, references=[recs[5][0]])])
    assert st.evict(1, drop) is None  # referenced since the round began: left for the next round
    assert st.get(recs[5][0]) is not None and st.info()["segments"] == 1
    st.unfence()
    st.close()


def test_a_reference_checked_before_an_eviction_is_refused_after_it(tmp_path):
    st = RecordStore(tmp_path, roll_records=20)
    recs = fill(st, 40, ("a",))
    st.roll_open_log()
    epoch = st.epoch  # the gateway reads it before it looks the references up
    assert st.entry(recs[0][0]) is not None
    st.fence({rid for rid, _ in recs[:20]})
    st.evict(1, dict(recs[:20]))
    st.unfence()
    report = Record(id=new_record_id(), scenario="a", kind="report", score=1.0, references=[recs[0][0]])
    with pytest.raises(BadRequest, match="retention has evicted it"):
        st.append([report], refs_checked_at=epoch)
    ok = Record(id=new_record_id(), scenario="a", kind="report", score=1.0, references=[recs[30][0]])
    assert st.append([ok], refs_checked_at=epoch) == [True]  # still there: looked up again and kept
    st.close()


@pytest.mark.parametrize("whole", [True, False])
def test_a_failed_index_update_leaves_the_index_matching_the_files(tmp_path, monkeypatch, whole):
    import sqlite3

    st = RecordStore(tmp_path, roll_records=50)
    recs = fill(st, 100)
    st.roll_open_log()
    drop = {rid: sc for rid, sc in recs[:50] if whole or sc == "a"}

    def broken(*args):
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(st._rolled, "evict", broken)
    st.fence(set(drop))
    with pytest.raises(sqlite3.OperationalError):
        st.evict(1, drop)
    st.unfence()
    check_consistent(st, {rid for rid, _ in recs} - set(drop), set(drop))  # the file changed; the index follows
    st.close()


def test_an_index_from_before_retention_gets_its_segment_parts(tmp_path):
    import sqlite3

    st = RecordStore(tmp_path, roll_records=10)
    fill(st, 30)
    st.roll_open_log()
    want = st._rolled.parts()
    st.close()
    db = sqlite3.connect(tmp_path / "records" / "index.sqlite")
    db.execute("DROP TABLE segment_parts")
    db.commit()
    db.close()
    st = RecordStore(tmp_path)
    assert st._rolled.parts() == want and sorted(want) == [1, 2, 3]
    st.close()


def test_a_slow_log_is_rolled_once_its_records_are_due(tmp_path):
    st = RecordStore(tmp_path)  # 20,000 records to a roll: this log would not roll for a long time
    fill(st, 10)
    later = time.time() + 120
    ret = Retainer(st, RetentionConfig(RetentionPolicy(max_age=60)), set, clock=lambda: later)
    ret.run_round()  # rolls the log
    st.roll_open_log()  # waits for that roll
    assert ret.run_round()["segments"] == 1 and len(st) == 0
    st.close()


CRASHER = """
import os, signal, sys, json
from reef_lab.records.store import RecordStore
st = RecordStore(sys.argv[1], roll_records=50)
drop = json.loads(sys.argv[3])
st.fence(set(drop))
for step in st._evict_steps(int(sys.argv[2]), drop):
    if step == sys.argv[4]:
        os.kill(os.getpid(), signal.SIGKILL)
print("finished", flush=True)
"""


@pytest.mark.parametrize("whole,step", [(True, "written"), (True, "unlinked"), (True, "indexed"),
                                        (False, "written"), (False, "marked"), (False, "replaced"),
                                        (False, "indexed")])
def test_a_crash_between_eviction_steps_loses_nothing_that_stays(tmp_path, whole, step):
    st = RecordStore(tmp_path, roll_records=50)
    recs = fill(st, 150)
    st.roll_open_log()
    drop = {rid: sc for rid, sc in recs[50:100] if whole or sc == "a"}
    st.close()
    p = subprocess.run([sys.executable, "-c", CRASHER, str(tmp_path), "2", json.dumps(drop), step], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    st = RecordStore(tmp_path)  # recovery
    stays = {rid for rid, _ in recs} - set(drop)
    present = {rid for rid, _ in recs if st.entry(rid) is not None}
    assert stays <= present
    # what was to go is all there (before the swap) or all gone (after it): never half, never a dangling index row
    assert present - stays in (set(), set(drop))
    check_consistent(st, present, {rid for rid, _ in recs} - present)
    st.close()


def test_a_reader_in_another_process_reads_again_when_a_segment_goes_under_it(tmp_path):
    from reef_lab.records.segments import collect_records

    st = RecordStore(tmp_path, roll_records=20)
    recs = fill(st, 60, ("a",))
    st.roll_open_log()
    calls = []

    def query(lf):  # the segments are listed; now a retention round deletes the oldest before they are read
        if not calls:
            st.fence({rid for rid, _ in recs[:20]})
            st.evict(1, dict(recs[:20]))
            st.unfence()
        calls.append(1)
        return lf.select("id")
    ids = set(collect_records(tmp_path, query)["id"])
    assert len(calls) == 2 and ids == {rid for rid, _ in recs[20:]}
    st.close()


# ---- the gateway ---------------------------------------------------------------------------------------------------
class Served:
    def __init__(self, gw: Gateway):
        self.gw = gw
        self.server = make_server("127.0.0.1", 0, create_app(gw), threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.gw.close()


def chat(gw, scenario, i=0):
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": f"hi {i}"}]}
    reply = gw.infer("openai.chat", body, scenario)
    return reply.headers["x-reef-agent-record-id"]


def test_status_counts_and_logs_each_evicted_segment(tmp_path, stub_url, caplog):
    cfg = RetentionConfig(RetentionPolicy(max_records=60), {"b": RetentionPolicy(max_records=10)}, interval=3600)
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=5), retention=cfg, roll_records=20)
    s = Served(gw)
    try:
        written = []
        with caplog.at_level(logging.INFO, logger="reef_lab.records.retention"):
            for i in range(50):  # rounds run in the background after each roll meanwhile
                for scenario in ("a", "b"):
                    rid = chat(gw, scenario, i)
                    written += [(rid, scenario), (gw.report(scenario, {"score": 1.0, "references": [rid]})[1],
                                                  scenario)]
            gw.store.roll_open_log()
            gw.retainer.run_round()  # after any round under way
        left = len(list(gw.store.folder.glob("seg-*.parquet")))
        status = requests.get(s.url + "/reef/status", timeout=10).json()["retention"]
        ev = status["evicted"]
        assert ev["segments"] == gw.store.info()["rolls"] - left > 0 and ev["rewritten"] > 0
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("retention: segment")]
        assert len(lines) == ev["segments"] + ev["rewritten"]
        assert sum(v["records"] for v in status["by_scenario"].values()) == ev["records"] == 200 - len(gw.store)
        assert status["by_scenario"]["b"]["records"] == 100 - len(gw.store.ids("b")) >= 80
        # the newest 60 records stay, but for b's beyond its newest 10
        newest = written[-60:]
        assert {rid for rid, sc in newest if sc == "a"} <= set(gw.store.ids("a"))
        assert {rid for rid, sc in written if sc == "b"}.intersection(gw.store.ids("b")) >= \
            {rid for rid, sc in written if sc == "b"}.intersection(rid for rid, _ in written[-20:])
        assert status["policy"]["scenarios"] == {"b": {"max_bytes": None, "max_age": None, "max_records": 10}}
        # reads through the API agree with what is left
        page = requests.get(s.url + "/reef/scenarios/b/records?limit=1000", timeout=10).json()["records"]
        assert {r["id"] for r in page} == set(gw.store.ids("b"))
    finally:
        s.close()


def test_episode_reports_race_retention_rounds_and_every_one_is_answered(tmp_path, stub_url, monkeypatch):
    """Issue 38 item 9: an episode report raced a retention rewrite once (500 'parquet: File out of specification'):
    the episode's receipts came from a scan whose plan names segment files by path (and has read their metadata),
    collected while a round replaced one of them. Here a reporter thread posts episode reports over HTTP while
    retention rounds in another thread rewrite the segment that holds each episode's calls. The window (a scan
    planned, not yet collected) lasts milliseconds; a hook widens it to its worst, and without timing: each episode
    read, once its scan is planned, waits until its round has swapped the segment (what main then reads: the 500)
    or is waiting to swap it (the read holds the segments' shared lock: the fix). So the result does not depend on
    how busy the CPUs are."""
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=10), roll_records=1000)
    s = Served(gw)
    st, rw = gw.store, gw.store._segments_rw
    retainer = Retainer(st, RetentionConfig(RetentionPolicy(), {"b": RetentionPolicy(max_records=2)}), lambda: set())
    planned, swapped = threading.Event(), threading.Event()
    plain_scan, plain_evict = st.scan, st.evict

    def scan():
        frame = plain_scan()
        if planned.is_set():
            return frame  # (only the round's episode read is held)
        planned.set()
        deadline = time.monotonic() + 120
        while not swapped.is_set() and not (rw._waiting and rw._readers) and time.monotonic() < deadline:
            time.sleep(0.005)
        return frame

    def evict(no, drop):
        assert planned.wait(120), "no episode read planned its scan"
        try:
            return plain_evict(no, drop)
        finally:
            swapped.set()
    monkeypatch.setattr(st, "scan", scan)
    monkeypatch.setattr(st, "evict", evict)
    answers, rounds = [], []
    try:
        for k in range(6):
            calls = [gw.infer("openai.chat", {"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": f"turn {t} of e{k}"}]}, "a", None, {"x-reef-session": f"e{k}"}
            ).headers["x-reef-agent-record-id"] for t in range(3)]
            for i in range(6):
                chat(gw, "b", i)
            st.roll_open_log()  # a segment holds the episode's calls and b's, of which the round takes b's
            for i in range(3):
                chat(gw, "b", i)
            planned.clear()
            swapped.clear()

            def report(k=k):
                r = requests.post(s.url + "/reef/report", headers={"x-reef-scenario": "a"},
                                  json={"score": 1.0, "episode": f"e{k}"}, timeout=120)
                answers.append((r.status_code, r.text))
            threads = [threading.Thread(target=report, name="reporter"),
                       threading.Thread(target=lambda: rounds.append(retainer.run_round()), name="round")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            assert answers[-1][0] == 200, answers[-1]  # main: 500 'parquet: File out of specification'
            report_id = json.loads(answers[-1][1])["agent_record_id"]
            assert st.get(report_id)["references"] == calls
            assert rounds[-1]["rewritten"] == 1 and rounds[-1]["records"] == (6 if k == 0 else 9), rounds[-1]
        assert len(answers) == len(rounds) == 6
    finally:
        s.close()


def test_the_releases_answer_comes_from_one_read_of_the_index(tmp_path, stub_url, monkeypatch):
    """(Found by the default suite: test_live_swap saw serving 'm:v1' with no releases listed: list_releases read
    the index twice and a publish landed in between.)"""
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=5))
    try:
        gw.create_scenario({"name": "m"})
        published = {"version": "v1", "release_id": "m:v1"}  # what a second read would find after a publish
        monkeypatch.setattr(gw.releases, "serving", lambda name: published)
        out = gw.list_releases("m")
        assert out["serving"] == "base" and out["releases"] == []
    finally:
        gw.close()


def test_retention_is_the_operators_only(tmp_path, stub_url):
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=5))
    s = Served(gw)
    try:
        for body in ({"name": "x", "retention": {"max_age": "1s"}},
                     {"name": "x", "recipe": "basic", "config": {"retain_max_records": 1}}):
            r = requests.post(s.url + "/reef/scenarios", json=body, timeout=10)
            assert r.status_code == 400, r.text
        assert requests.get(s.url + "/reef/status", timeout=10).json()["retention"] is None
    finally:
        s.close()


def test_serve_flags(tmp_path, capsys):
    cfg = parse_serve_config(["--data-dir", str(tmp_path), "--retain-max-bytes", "2GB", "--retain-max-age", "12h",
                              "--retain-max-records", "1000", "--retain-scenarios", "{eval-*: {max_age: 10m}}",
                              "--roll-records", "500"])
    rc = cfg.retention_config()
    assert rc.data_dir == RetentionPolicy(2 << 30, 43200, 1000) and rc.policy_for("eval-1").max_age == 600
    assert cfg.roll_records == 500
    for flags, says in [(["--retain-max-age", "soon"], "retain_max_age must be a duration"),
                        (["--retain-scenarios", "{x: {max_rows: 3}}"], "unknown limit"),
                        (["--retain-max-records", "0"], "at least 1")]:
        with pytest.raises(SystemExit):
            parse_serve_config(["--data-dir", str(tmp_path), *flags])
        assert says in capsys.readouterr().err


OPAQUE = '''
class Learner:
    """Takes reports and says nothing about what it keeps (not a RecordHolder)."""
    def __init__(self):
        self.got = []
    def on_record(self, record): self.got.append(record["id"])
    def request_training(self): return {}
    def promote(self, candidate): raise RuntimeError("no")
    def on_rollback(self): return None
    def status(self): return {"got": len(self.got)}
    def close(self): return None


class Recipe:
    name, evolves, config = "opaque", "harness", None
    def __init__(self, **config): pass
    def validate_report(self, report): return None
    def learner(self, ctx): return Learner()
    @staticmethod
    def run_experiment(data, progress=True): raise NotImplementedError
'''


def test_a_learner_that_does_not_say_what_it_holds_keeps_all_its_reports(tmp_path, stub_url, monkeypatch):
    (tmp_path / "opaque_recipe.py").write_text(OPAQUE)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RetentionConfig(RetentionPolicy(max_records=1), interval=3600)
    gw = Gateway(tmp_path / "data", UpstreamEngine(stub_url, timeout=5), retention=cfg, roll_records=10,
                 allowed_recipes=["opaque_recipe:Recipe"])
    try:
        gw.create_scenario({"name": "o", "recipe": "opaque_recipe:Recipe"}, operator=True)
        kept = set()
        for i in range(30):
            rid = chat(gw, "o", i)
            chat(gw, "plain", i)
            if i % 5 == 0:
                kept |= {rid, gw.report("o", {"score": 1.0, "references": [rid]})[1]}
        gw.store.roll_open_log()
        newest = chat(gw, "plain")  # in the open log: the newest record, which max_records=1 keeps
        gw.retainer.run_round()
        # everything else went, the basic scenario's records included
        assert set(gw.store.ids()) == kept | {newest}
    finally:
        gw.close()


@pytest.fixture
def tiny_engine(tiny_model_dir):
    from reef_lab.engines.embedded import EmbeddedEngine

    return EmbeddedEngine.from_path(str(tiny_model_dir), max_batch=8)


def test_learners_keep_what_they_have_not_learned_and_lineage_keeps_what_trained_a_release(tmp_path, tiny_engine):
    from reef_lab.publishing.export import export_parquet

    cfg = RetentionConfig(RetentionPolicy(max_records=1), interval=3600)
    gw = Gateway(tmp_path / "data", tiny_engine, retention=cfg, roll_records=8)
    try:
        gw.create_scenario({"name": "s", "recipe": "sft", "config": {
            "mode": "manual", "batch_size": 4, "trainer": {"lr": 1e-3, "micro_batch_size": 4}}})
        pairs = []
        for i in range(12):
            body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": f"{i}+1="}]}
            rid = gw.infer("openai.chat", body, "s").headers["x-reef-agent-record-id"]
            pairs.append((rid, gw.report("s", {"score": float(i < 4), "references": [rid]})[1]))
        ln = gw.learner("s")
        assert ln.wait_idle(120) and ln.status()["pool"] == 4
        pooled = {x for pair in pairs[:4] for x in pair}
        gw.store.roll_open_log()
        chat(gw, "other")  # the newest record (max_records=1 keeps it), in the open log
        gw.retainer.run_round()
        assert set(gw.store.ids("s")) == pooled  # the pool's samples and their reports: nothing else
        gw.train("s")
        assert ln.wait_idle(300) and ln.last_error is None, ln.status()
        release = gw.list_releases("s")["releases"][0]
        assert set(release["records"]) | set(release["reports"]) == pooled
        exported = export_parquet(tmp_path / "data", "s", tmp_path / "export")
        saved = {k: p.read_bytes() for k, p in exported.items()}
        for i in range(16):  # more traffic, unreported: it all goes
            chat(gw, "s", i)
        gw.store.roll_open_log()
        chat(gw, "other")
        gw.retainer.run_round()  # (after the rounds each roll started)
        assert set(gw.store.ids("s")) == pooled  # the lineage keeps them
        assert gw.retainer.evicted["records"] >= 16 + 16 and gw.retainer.last_error is None
        assert {k: p.read_bytes() for k, p in exported.items()} == saved  # exports are copies, untouched
        training = export_parquet(tmp_path / "data", "s", tmp_path / "export2")["training"]
        t = pl.read_parquet(training)
        assert t.height == 4 and t["token_ids"].null_count() == 0  # each sample of the lineage still readable
    finally:
        gw.close()
