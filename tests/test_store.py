"""The record store: durability, group commit, idempotent ids, Parquet rolls, crash recovery."""

import os
import threading
import time

import polars as pl
import pytest

from reef_lab.errors import Conflict
from reef_lab.records.record import Record, content_hash
from reef_lab.records.store import RecordStore, read_log, scan_records


def rec(i, scenario="s", **kw):
    r = Record(id=f"r{i:05d}", scenario=scenario, kind="inference", request={"i": i}, response={"o": i}, **kw)
    r.content_hash = content_hash(r)  # client-chosen ids carry the hash that makes repeats idempotent
    return r


def test_append_get_and_reopen(tmp_path):
    st = RecordStore(tmp_path)
    assert st.append([rec(1, token_ids=[1, 2], logprobs=[-0.5, -1.0])]) == [True]
    got = st.get("r00001")
    assert got["request"] == {"i": 1} and got["token_ids"] == [1, 2] and got["logprobs"] == [-0.5, -1.0]
    st.close()
    st2 = RecordStore(tmp_path)
    assert len(st2) == 1
    again = st2.get("r00001")  # served from the log, as before the restart: a close does not roll it
    assert again["response"] == {"o": 1} and again["token_ids"] == [1, 2]
    assert not list((tmp_path / "records").glob("seg-*.parquet"))
    st2.close()


def test_same_id_same_content_is_idempotent_other_content_conflicts(tmp_path):
    st = RecordStore(tmp_path)
    assert st.append([rec(1)]) == [True]
    assert st.append([rec(1)]) == [False]
    with pytest.raises(Conflict, match="different content"):
        other = Record(id="r00001", scenario="s", kind="inference", request={"i": 2})
        other.content_hash = content_hash(other)
        st.append([other])
    with pytest.raises(Conflict, match="twice"):
        st.append([rec(7), rec(7)])
    assert len(st) == 1
    st.close()


def test_group_commit_shares_fsyncs_under_concurrency(tmp_path):
    st = RecordStore(tmp_path)
    n_threads, per = 16, 50

    def work(t):
        for i in range(per):
            st.append([rec(t * 1000 + i)])
    ts = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert len(st) == n_threads * per
    assert st.stats["commits"] < n_threads * per  # some appends shared a write+fsync
    assert st.stats["max_group"] > 1
    assert st.scan().select(pl.len()).collect().item() == n_threads * per
    st.close()


def test_roll_into_parquet_and_scan_everything(tmp_path):
    st = RecordStore(tmp_path, roll_records=10)
    for i in range(35):
        st.append([rec(i, scenario="a" if i % 2 else "b")])
    st.close()
    segs = sorted((tmp_path / "records").glob("seg-*.parquet"))
    assert len(segs) >= 3
    df = scan_records(tmp_path).collect()
    assert sorted(df["id"]) == [f"r{i:05d}" for i in range(35)]
    assert df.filter(pl.col("scenario") == "a").height == 17
    st2 = RecordStore(tmp_path)
    assert st2.ids(scenario="b")[:2] == ["r00000", "r00002"]
    assert [r["id"] for r in st2.get_many(["r00034", "r00003", "nope"])] == ["r00034", "r00003"]
    st2.close()


def test_torn_tail_is_cut_and_acknowledged_records_survive(tmp_path):
    st = RecordStore(tmp_path)
    for i in range(5):
        st.append([rec(i)])
    log_path = next((tmp_path / "records").glob("log-*.bin"))
    # Simulate a crash: no close, plus half a frame at the end of the log.
    with open(log_path, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x12\x34garbage")
    st2 = RecordStore(tmp_path)
    assert sorted(st2.ids()) == [f"r{i:05d}" for i in range(5)]
    records, good = read_log(log_path) if log_path.exists() else ([], 0)
    assert good == (log_path.stat().st_size if log_path.exists() else 0)
    st2.append([rec(9)])
    st2.close()
    assert scan_records(tmp_path).select(pl.len()).collect().item() == 6


def test_batch_write_is_one_frame(tmp_path):
    st = RecordStore(tmp_path)
    st.append([rec(i) for i in range(4)])
    log_path = next((tmp_path / "records").glob("log-*.bin"))
    records, good = read_log(log_path)
    assert [r["id"] for r in records] == [f"r{i:05d}" for i in range(4)]
    # Cutting the batch's frame anywhere loses the whole batch, never part of it.
    cut = tmp_path / "cut.bin"
    cut.write_bytes(log_path.read_bytes()[:good - 3])  # the log's data ends at `good`; zeros follow
    assert read_log(cut)[0] == []
    cut.write_bytes(log_path.read_bytes()[:good - 3] + bytes(100))  # torn, then preallocated zeros
    assert read_log(cut) == ([], 0)
    st.close()


def test_failed_write_raises_and_loses_nothing_acknowledged(tmp_path):
    from reef_lab.errors import StoreUnavailable
    st = RecordStore(tmp_path)
    st.append([rec(1)])
    os.close(st._log.fd)  # make the next write fail
    st._log.fd = os.open(os.devnull, os.O_RDONLY)
    with pytest.raises(StoreUnavailable):
        st.append([rec(2)])
    assert st.entry("r00002") is None
    assert st.get("r00001") is not None


def test_segments_of_an_older_schema_stay_readable(tmp_path):
    """A schema-1 segment (no stored_at column) opens, scans and serves its records."""
    from reef_lab.records.record import PARQUET_SCHEMA, records_to_frame
    folder = tmp_path / "records"
    folder.mkdir()
    old = records_to_frame([rec(1).to_dict()]).drop("stored_at").with_columns(schema_version=pl.lit(1, pl.Int32))
    old.write_parquet(folder / "seg-000001.parquet")
    st = RecordStore(tmp_path)
    assert st.get("r00001")["request"] == {"i": 1}
    st.append([rec(2)])
    df = st.scan().collect()
    assert df.columns == list(PARQUET_SCHEMA) and df.height == 2
    assert df.filter(pl.col("id") == "r00001")["stored_at"].to_list() == [None]
    st.close()
    assert scan_records(tmp_path).select(pl.len()).collect().item() == 2


def test_pages_walk_one_scenario_in_id_order(tmp_path):
    st = RecordStore(tmp_path)
    for i in (5, 1, 3, 2, 4):  # client-chosen ids arriving out of order
        r = Record(id=f"x{i}", scenario="s", kind="report" if i % 2 else "inference", score=1.0)
        r.content_hash = content_hash(r)
        st.append([r])
    st.append([rec(9, scenario="other")])
    assert st.page("s", None, 0.0, None, 2) == (["x1", "x2"], "x2")
    assert st.page("s", None, 0.0, "x2", 2) == (["x3", "x4"], "x4")
    assert st.page("s", None, 0.0, "x4", 2) == (["x5"], None)
    assert st.page("s", "report", 0.0, None, 10) == (["x1", "x3", "x5"], None)
    assert st.forget("s") == 5 and st.page("s", None, 0.0, None, 10) == ([], None)
    st.close()
    st2 = RecordStore(tmp_path)  # rebuilt from disk: deleted scenarios' records are back, hidden by `since`
    assert st2.ids("s") == ["x1", "x2", "x3", "x4", "x5"]
    assert st2.ids("s", since=time.time() + 1) == []
    st2.close()


def test_rolled_segment_equals_the_records_written(tmp_path):
    """The Parquet roll (polars' JSON reader over the log) keeps every value, string feedback included."""
    from reef_lab.records.record import frame_row_to_dict
    st = RecordStore(tmp_path, roll_records=1000)
    written = [Record(id="f1", scenario="s", kind="report", score=0.5, feedback="plain text", references=[]),
               Record(id="f2", scenario="s", kind="report", score=None, feedback={"why": ["a", 1]}, metadata={"k": 1}),
               rec(3, token_ids=[5, 6], logprobs=[-0.25, -1.5], tags={"u": "v"})]
    for r in written[:2]:
        r.content_hash = content_hash(r)
    st.append(written[:2])  # one batch frame
    st.append(written[2:])
    def rows(df):
        return sorted((frame_row_to_dict(r) for r in df.to_dicts()), key=lambda r: r["id"])
    expected = rows(st.scan().collect())  # before the roll: built from the records in memory
    st.roll_open_log()
    st.close()
    assert st.stats["rolls"] == 1 and st.stats["roll_errors"] == 0
    assert rows(scan_records(tmp_path).collect()) == expected
    st2 = RecordStore(tmp_path)
    assert st2.get("f1")["feedback"] == "plain text" and st2.get("f2")["feedback"] == {"why": ["a", 1]}
    assert st2.get("r00003")["logprobs"] == [-0.25, -1.5] and st2.get("r00003")["tags"] == {"u": "v"}
    st2.close()


def test_json_values_of_every_kind_survive_the_roll_and_reopen(tmp_path):
    """Strings where JSON columns usually hold objects (an imported record may have a string request), and text
    that JSON must escape, read back the same from the tail, from the Parquet segment and after a reopen."""
    odd = "a \"quoted\" line\nwith a tab\t, a backslash \\, \u00e9t\u00e9 and \U0001f41f"
    written = [Record(id="s1", scenario="s", kind="inference", request="just text", response=odd, metadata="m"),
               Record(id="s2", scenario="s", kind="report", feedback=odd, score=1.0,
                      metadata={"response": "a nested key named like a JSON column"}),
               Record(id="s3", scenario="s", kind="inference", request={"n": [1, 2.5, 1.0, 1.5e300, None, True]},
                      response=7, tags={"t": odd})]
    for r in written:
        r.content_hash = content_hash(r)
    fields = ("request", "response", "feedback", "metadata", "tags", "score")
    import orjson
    def exact(values):  # JSON text tells 1.0 from 1, which == does not
        return orjson.dumps(values, option=orjson.OPT_SORT_KEYS)
    expect = exact({r.id: {k: getattr(r, k) for k in fields} for r in written})
    st = RecordStore(tmp_path)
    st.append(written[:2])
    st.append(written[2:])
    def seen(get):
        return exact({r.id: {k: get(r.id)[k] for k in fields} for r in written})
    assert seen(st.get) == expect
    assert seen(lambda rid: st.get_many([rid])[0]) == expect
    from reef_lab.records.record import frame_row_to_dict
    def from_frame(df):
        return exact({r["id"]: {k: r[k] for k in fields} for r in map(frame_row_to_dict, df.to_dicts())})
    assert from_frame(st.scan().collect()) == expect
    st.roll_open_log()
    st.close()
    assert st.stats["rolls"] == 1 and st.stats["roll_errors"] == 0
    assert from_frame(scan_records(tmp_path).collect()) == expect
    st2 = RecordStore(tmp_path)
    assert seen(st2.get) == expect
    st2.close()


def test_record_keys_read_from_text_match_the_parsed_record():
    """The index reads id, scenario, kind, hash and write time from a record's JSON text without parsing it; any
    text the fast path cannot vouch for is parsed instead."""
    import orjson

    from reef_lab.records.store import record_key
    samples = [rec(1).to_dict(), Record(id="rec_0190abc", scenario="a.b-c_d", kind="report", score=0.5).to_dict(),
               Record(id='odd"id', scenario="s", kind="train", metadata={"stored_at": 1}).to_dict(),
               {**rec(2).to_dict(), "content_hash": ""}]
    for i, d in enumerate(samples):
        d["stored_at"] = 1_790_000_000.123456 + i
        assert record_key(orjson.dumps(d)) == (d["id"], d["scenario"], d["kind"], d["content_hash"], d["stored_at"])
    old = {k: v for k, v in rec(3).to_dict().items() if k != "stored_at"}  # schema 1: no stored_at
    assert record_key(orjson.dumps(old))[4] == old["created_at"]


def test_logs_that_batch_records_as_a_json_array_still_open(tmp_path):
    """Logs written before frames joined records by newlines held a batch as one JSON array."""
    import struct
    import zlib

    import orjson
    (tmp_path / "records").mkdir()
    batch = [rec(1).to_dict(), rec(2).to_dict()]
    for d in batch:
        d["stored_at"] = time.time()
    frames = b""
    for payload in (orjson.dumps(batch), orjson.dumps(rec(3).to_dict() | {"stored_at": time.time()})):
        frames += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    (tmp_path / "records" / "log-000001.bin").write_bytes(frames)
    st = RecordStore(tmp_path)
    assert sorted(st.ids()) == ["r00001", "r00002", "r00003"] and st.get("r00002")["request"] == {"i": 2}
    assert st.scan().select(pl.len()).collect().item() == 3
    st.close()


def test_primary_follows_relay_logs_and_rolls_them_once_closed(tmp_path):
    """A relay worker's log (RelayLog) read by the primary's store as it grows, rolled once the relay moves on."""
    from reef_lab.records.store import RelayLog

    primary = RecordStore(tmp_path)
    primary.follow_relays()
    relay = RelayLog(tmp_path, roll_records=5)
    relay.append([rec(i) for i in range(3)])
    big = rec(3, metadata={"text": "x" * 200_000})  # one frame larger than the follower's 64 KiB read slice
    relay.append([big])
    primary.append([rec(100)])
    assert primary.entry("r00002") is not None  # an unknown id makes the primary look at the relay's log
    assert primary.get("r00003")["metadata"]["text"] == "x" * 200_000
    relay.append([rec(i) for i in range(4, 8)])  # the 5th record fills the log: the relay starts another
    assert sorted(primary.ids()) == sorted([f"r{i:05d}" for i in range(8)] + ["r00100"])
    deadline = time.time() + 10
    while primary.info()["rolls"] < 1 and time.time() < deadline:  # the closed relay log becomes a segment
        time.sleep(0.05)
    assert primary.info()["rolls"] >= 1
    assert primary.get("r00001")["response"] == {"o": 1}
    # The relay dies mid-write: its torn tail is cut, everything acknowledged before it stays.
    log_path = tmp_path / "records" / f"log-{relay._log.no:06d}.bin"
    with open(log_path, "r+b") as f:
        f.seek(relay._log.size)
        f.write(b"\x40\x00\x00\x00\x12\x34torn")
    relay.close()
    primary.follow()
    assert primary.entry("r00007") is not None and len(primary) == 9
    primary.close()
    assert sorted(scan_records(tmp_path).collect()["id"]) == sorted([f"r{i:05d}" for i in range(8)] + ["r00100"])


def test_rolled_records_are_read_through_the_on_disk_index(tmp_path):
    st = RecordStore(tmp_path, roll_records=100)
    for i in range(350):
        st.append([rec(i, scenario="a" if i % 3 else "b")])
    st.roll_open_log()
    st.close()
    st = RecordStore(tmp_path)
    assert not st._index  # every record rolled: nothing about them is held in memory
    assert len(st) == 350 and st._rolled.count == 350
    got = st.get_many(["r00349", "r00007", "r00123", "nope", "r00124"])
    assert [r["id"] for r in got] == ["r00349", "r00007", "r00123", "r00124"]
    assert [r["request"] for r in got] == [{"i": 349}, {"i": 7}, {"i": 123}, {"i": 124}]
    assert st.entry("r00123").scenario == "b" and st.entry("r00124").scenario == "a"
    # a client-chosen id stays idempotent once rolled: same content is not written again, other content conflicts
    assert st.append([rec(5, scenario="a")]) == [False]
    other = Record(id="r00005", scenario="s", kind="inference", request={"i": -1})
    other.content_hash = content_hash(other)
    with pytest.raises(Conflict, match="different content"):
        st.append([other])
    st.close()


def test_paging_merges_rolled_and_unrolled_records_in_id_order(tmp_path):
    st = RecordStore(tmp_path, roll_records=10)
    for i in range(0, 60, 2):
        st.append([rec(i)])
    st.roll_open_log()
    st.close()
    st = RecordStore(tmp_path, roll_records=1000)
    for i in range(1, 60, 2):  # interleaved ids, still in the open log
        st.append([rec(i)])
    seen, after = [], None
    while True:
        page, after = st.page("s", None, 0.0, after, 7)
        seen += page
        if after is None:
            break
    assert seen == [f"r{i:05d}" for i in range(60)]
    assert st.ids("s") == seen
    st.close()


@pytest.mark.parametrize("damage", ["delete", "garbage", "stale"])
def test_a_missing_damaged_or_stale_index_is_rebuilt_from_the_segments(tmp_path, damage):
    st = RecordStore(tmp_path, roll_records=50)
    for i in range(120):
        st.append([rec(i)])
    st.roll_open_log()
    st.close()
    index = tmp_path / "records" / "index.sqlite"
    if damage == "delete":
        index.unlink()
    elif damage == "garbage":
        for p in index.parent.glob("index.sqlite*"):
            p.unlink()
        index.write_bytes(b"not a database" * 100)
    else:  # a segment the index does not list (a crash between the segment's rename and its index commit)
        import sqlite3
        db = sqlite3.connect(index)
        db.execute("DELETE FROM segments WHERE no = (SELECT max(no) FROM segments)")
        db.commit()
        db.close()
    st = RecordStore(tmp_path)
    assert len(st) == 120
    assert st.get("r00119")["request"] == {"i": 119} and st.get("r00000")["request"] == {"i": 0}
    st.close()


def test_unrolled_records_are_read_from_the_log_not_memory(tmp_path):
    st = RecordStore(tmp_path)
    st.append([rec(1), rec(2)])
    e = st.entry("r00002")
    assert e.chunk == st._log.no and e.pos > 0 and e.size > 0
    assert not hasattr(st._tail[st._log.no], "records")  # the chunk keeps ids and a descriptor, no record text
    with open(tmp_path / "records" / f"log-{st._log.no:06d}.bin", "rb") as f:
        f.seek(e.pos)
        assert f.read(e.size).startswith(b'{"id":"r00002"')
    assert st.get("r00002")["response"] == {"o": 2}
    st.close()


def test_relay_logs_rolled_while_the_primary_follows_are_indexed_once(tmp_path):
    """Many short relay logs rolled while other threads keep asking the primary to follow: every record is indexed
    once, every roll succeeds, nothing is followed again after its roll (a soak found a log followed a second time
    between its roll and its deletion: its records were indexed twice and the second roll failed for good)."""
    from reef_lab.records.store import RelayLog

    primary = RecordStore(tmp_path)
    primary.follow_relays()
    relay = RelayLog(tmp_path, roll_records=20)
    stop, errors = threading.Event(), []

    def look():
        while not stop.is_set():
            try:
                primary.follow()
                primary.entry("nope")
            except Exception as e:  # noqa: BLE001 - collected, asserted below
                errors.append(e)
    lookers = [threading.Thread(target=look) for _ in range(3)]
    [t.start() for t in lookers]
    for i in range(0, 2000, 4):
        relay.append([rec(j) for j in range(i, i + 4)])
    relay.close()
    deadline = time.time() + 30
    while time.time() < deadline and (primary._roll_queue or any(no in primary._followed for no in list(
            primary._followed))):
        time.sleep(0.05)
    stop.set()
    [t.join() for t in lookers]
    assert not errors
    assert primary.stats["roll_errors"] == 0 and primary.stats["rolls"] >= 99
    assert len(primary) == 2000 and len(primary.ids()) == 2000
    assert not primary._index  # every relay log was rolled; nothing left indexed in memory
    assert primary.get("r01999")["request"] == {"i": 1999}
    primary.close()


def test_a_record_with_an_integer_beyond_64_bits_is_stored_and_read_back(tmp_path):
    """A model's tool call may carry an integer orjson cannot write (a calculator result of 10^20): the record is
    stored (no 500), its exact digits on disk, and read back (that number as a float), before and after a roll."""
    from reef_lab.records.record import Record, new_record_id

    big = 123456789012345678901234567890
    st = RecordStore(tmp_path / "data")
    rec = Record(id=new_record_id(), scenario="s", kind="inference", dialect="openai.chat",
                 request={"messages": []}, response={"ok": True},
                 metadata={"tool_calls": [{"name": "mul", "arguments": {"a": big, "b": 2}}]})
    assert st.append([rec]) == [True]
    got = st.get(rec.id)["metadata"]["tool_calls"][0]["arguments"]
    assert got["b"] == 2 and got["a"] == pytest.approx(float(big))
    assert str(big).encode() in b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
    st.close()
    st = RecordStore(tmp_path / "data")  # reopened: the closed log is rolled into Parquet
    assert st.get(rec.id)["metadata"]["tool_calls"][0]["arguments"]["a"] == pytest.approx(float(big))
    st.close()
