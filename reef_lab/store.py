"""The record store: durable before the receipt leaves, Parquet for everything after.

Writes go to an append-only log (`records/log-NNNNNN.bin`, frames of `<len u32><crc32 u32><orjson>`) with group
commit: concurrent appenders queue their frames, the first one in becomes the leader, writes everybody's frames
with one `write` and one `fsync`, and wakes the rest. `append` returns only once its records are on disk, so a
receipt is never handed out for a record that `kill -9` (or a power cut) could lose.

When a log grows past `roll_records`/`roll_bytes` it is closed and a background thread rolls it into a Parquet
segment (`records/seg-NNNNNN.parquet`, written via polars, fsynced, renamed into place), then deletes the log.
Opening a store recovers from any crash point: a torn log tail is cut at the last good frame, a log whose segment
exists is deleted, a closed log without one is rolled. `scan_records(data_dir)` gives a polars LazyFrame over
segments plus logs and is safe to call from another process while a server writes.
"""

from __future__ import annotations

import bisect
import fcntl
import io
import logging
import os
import re
import struct
import threading
import time
import zlib
from _thread import allocate_lock as _allocate_lock
from dataclasses import dataclass
from pathlib import Path

import orjson
import polars as pl

from reef_lab.errors import Conflict, StoreUnavailable
from reef_lab.records import PARQUET_SCHEMA, Record, frame_row_to_dict, records_to_frame

log = logging.getLogger("reef_lab.store")

_HEADER = struct.Struct("<II")
PREALLOCATE = 1 << 20  # bytes of zeros written ahead of a log's data (see RecordStore._commit)
_FILE_RE = re.compile(r"^(log|seg)-(\d{6,})\.(bin|parquet)$")


def encode_frame(records: list[dict]) -> bytes:
    """One frame for one write: several records share a frame (and its CRC), so they land all or nothing."""
    payload = orjson.dumps(records[0] if len(records) == 1 else records)
    return _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _payloads(data: bytes) -> tuple[list[bytes], int]:
    """The intact frames' payloads of a log and the offset where intact data ends (a torn tail starts there)."""
    out, pos, n = [], 0, len(data)
    while pos + _HEADER.size <= n:
        length, crc = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if length == 0 or end > n:  # zeros: the log's preallocated, not yet written space
            break
        payload = data[pos + _HEADER.size:end]
        if zlib.crc32(payload) != crc:
            break
        out.append(payload)
        pos = end
    return out, pos


def _is_torn(path: Path, good: int) -> bool:
    """Whether a log holds more than zeros (its preallocated space) after its last intact frame."""
    with open(path, "rb") as f:
        f.seek(good)
        while chunk := f.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return True
    return False


def read_log(path: Path) -> tuple[list[dict], int]:
    """All intact records of a log and the byte offset where intact data ends."""
    payloads, good = _payloads(path.read_bytes())
    out = []
    for p in payloads:
        obj = orjson.loads(p)
        out.extend(obj) if isinstance(obj, list) else out.append(obj)
    return out, good


_NDJSON_SCHEMA = {k: v for k, v in PARQUET_SCHEMA.items() if k != "feedback"}


def log_to_frame(path: Path, records: list[dict]) -> pl.DataFrame:
    """A log file in the Parquet layout, parsed by polars' JSON reader (in Rust, off the GIL): rolling a
    20,000-record log this way holds the GIL for milliseconds instead of the ~0.2 s that building the frame
    from Python dicts takes, which serving would feel. `records` are the same records in memory; they supply
    `feedback`, whose string values the JSON reader cannot tell apart from JSON text."""
    lines = []
    for p in _payloads(path.read_bytes())[0]:
        if p[:1] == b"[":  # a batch written as one frame
            lines += [orjson.dumps(r) for r in orjson.loads(p)]
        else:
            lines.append(p)
    if len(lines) != len(records):
        raise RuntimeError(f"log {path.name} holds {len(lines)} records but {len(records)} are in memory")
    if not lines:
        return pl.DataFrame(schema=PARQUET_SCHEMA)
    df = pl.read_ndjson(io.BytesIO(b"\n".join(lines)), schema=_NDJSON_SCHEMA)
    feedback = [None if (v := r.get("feedback")) is None else orjson.dumps(v).decode() for r in records]
    return df.with_columns(feedback=pl.Series(feedback, dtype=pl.String)).select(list(PARQUET_SCHEMA))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _list_files(folder: Path) -> tuple[dict[int, Path], dict[int, Path]]:
    logs, segs = {}, {}
    for p in folder.iterdir() if folder.exists() else []:
        m = _FILE_RE.match(p.name)
        if m:
            (logs if m.group(1) == "log" else segs)[int(m.group(2))] = p
    return logs, segs


def scan_segments(paths: list[Path], tail: pl.DataFrame | list[pl.DataFrame] | None = None) -> pl.LazyFrame:
    """Segments (and in-memory tail frames) as one LazyFrame. Segments written by an older schema version lack
    newer columns; they read as nulls there, so old data dirs stay readable."""
    parts = [_conform(pl.scan_parquet(str(p))) for p in paths]
    tails = [] if tail is None else tail if isinstance(tail, list) else [tail]
    parts += [t.lazy() for t in tails]
    if not parts:
        return pl.DataFrame(schema=PARQUET_SCHEMA).lazy()
    return pl.concat(parts, how="vertical_relaxed")


def _conform(lf: pl.LazyFrame) -> pl.LazyFrame:
    names = set(lf.collect_schema().names())
    missing = [pl.lit(None, dtype).alias(k) for k, dtype in PARQUET_SCHEMA.items() if k not in names]
    return (lf.with_columns(missing) if missing else lf).select(list(PARQUET_SCHEMA))


def scan_records(data_dir: str | Path) -> pl.LazyFrame:
    """A LazyFrame over every record in a data dir (Parquet segments and not-yet-rolled logs).

    Safe while a server writes: logs are read before segments are listed, and a log whose segment exists is
    skipped, so a roll that happens in between neither hides nor doubles a record.
    """
    folder = Path(data_dir) / "records"
    logs, _ = _list_files(folder)
    log_frames = {}
    for no, path in sorted(logs.items()):
        try:
            log_frames[no] = read_log(path)[0]
        except FileNotFoundError:  # rolled away meanwhile: its segment is listed below
            continue
    _, segs = _list_files(folder)
    tail = [r for no, recs in sorted(log_frames.items()) if no not in segs for r in recs]
    return scan_segments([segs[no] for no in sorted(segs)], records_to_frame(tail) if tail else None)


def create_log(folder: Path) -> tuple[int, int]:
    """A new log under a number no writer has used, open for appending and flock-ed from the moment it appears
    (made under a temporary name, locked, then hard-linked into place): a log whose lock is free is closed, which
    is how the primary knows a relay has moved on from it (or died)."""
    logs, segs = _list_files(folder)
    no = max([*logs, *segs], default=0) + 1
    tmp = folder / f".log-creating-{os.getpid()}-{threading.get_ident()}"
    while True:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = folder / f"log-{no:06d}.bin"
        try:
            os.link(tmp, path)
        except FileExistsError:
            os.close(fd)
            no += 1
            continue
        finally:
            tmp.unlink(missing_ok=True)
        if (folder / f"seg-{no:06d}.parquet").exists():  # that log was rolled and deleted meanwhile
            path.unlink()
            os.close(fd)
            no += 1
            continue
        _fsync_dir(folder)
        return no, fd


@dataclass
class _Follow:
    """A relay's log the primary reads as it grows."""

    fd: int
    offset: int = 0


@dataclass
class _Chunk:
    """The records of one log file that are not yet in a Parquet segment."""

    no: int
    records: list[dict]
    frame: pl.DataFrame | None = None
    framed: int = 0  # how many of `records` `frame` covers

    def as_frame(self) -> pl.DataFrame:
        if self.framed < len(self.records):
            new = records_to_frame(self.records[self.framed:])
            self.frame = new if self.frame is None else pl.concat([self.frame, new])
            self.framed = len(self.records)
        return self.frame if self.frame is not None else pl.DataFrame(schema=PARQUET_SCHEMA)


class _Batch:
    """Appends that share one write and one fsync.

    Each appender that does not lead parks on its own pre-acquired lock; the committer releases exactly those
    locks when the batch is durable (or releases one of them to promote its owner to leader of the next batch).
    A shared Condition instead made every woken waiter queue again for the store's lock, one after another, and
    under the GIL that herd cost more CPU than the fsync it waited for (scripts/bench_gateway.py).
    """

    __slots__ = ("frames", "records", "waiters", "durable", "error")

    def __init__(self):
        self.frames: list[bytes] = []
        self.records: list[dict] = []
        self.waiters: list = []  # one acquired lock per parked appender
        self.durable = False
        self.error: str | None = None


@dataclass
class IndexEntry:
    scenario: str
    kind: str
    content_hash: str
    stored_at: float  # server write time: decides which incarnation of a scenario a record belongs to
    chunk: int  # log/segment number that holds the record


class RecordStore:
    """Append-only, group-committed, crash-safe record storage for one data dir."""

    def __init__(self, data_dir: str | Path, roll_records: int = 20_000, roll_bytes: int = 64 << 20):
        self.folder = Path(data_dir) / "records"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.roll_records, self.roll_bytes = roll_records, roll_bytes
        self._lock = threading.Lock()
        self._index: dict[str, IndexEntry] = {}
        self._scenario_ids: dict[str, list[str]] = {}  # durable ids per scenario, sorted
        self._tail: dict[int, _Chunk] = {}
        self._tail_by_id: dict[str, dict] = {}
        self._segments: dict[int, Path] = {}
        self._open = _Batch()
        self._idle = threading.Condition(self._lock)  # notified when no commit is running
        self._flushing = False
        self._broken: str | None = None
        self.stats = {"commits": 0, "records_written": 0, "max_group": 0, "sync_s": 0.0, "rolls": 0, "roll_errors": 0}
        self._followed: dict[int, _Follow] = {}
        self._following = False
        self._follow_lock = threading.Lock()
        self._recover()
        self._roll_queue: list[_Chunk] = []
        self._roll_wake = threading.Condition(self._lock)
        self._closed = False
        self._roller = threading.Thread(target=self._roll_loop, name="reef-roller", daemon=True)
        self._roller.start()

    # ---- recovery -------------------------------------------------------------------------------------------
    def _recover(self) -> None:
        logs, segs = _list_files(self.folder)
        for p in [*self.folder.glob("*.tmp"), *self.folder.glob(".log-creating-*")]:
            p.unlink()
        for no in [no for no in logs if no in segs]:  # rolled before the crash; the log's deletion was lost
            logs.pop(no).unlink()
        self._segments = dict(sorted(segs.items()))
        for no, path in sorted(logs.items()):
            records, good = read_log(path)
            if good < path.stat().st_size:
                if _is_torn(path, good):
                    log.warning("record log %s: cutting a torn tail of %d bytes", path.name,
                                path.stat().st_size - good)
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
            self._tail[no] = _Chunk(no, records)
        if self._segments:
            for no, path in self._segments.items():
                has = pl.read_parquet_schema(path)
                written = "stored_at" if "stored_at" in has else "created_at"  # schema 1 had no stored_at
                df = pl.read_parquet(path, columns=["id", "scenario", "kind", "content_hash", written])
                for rid, sc, kind, h, ts in df.iter_rows():
                    self._index[rid] = IndexEntry(sc, kind, h, ts, no)
        for no, chunk in self._tail.items():
            for r in chunk.records:
                self._index[r["id"]] = IndexEntry(r["scenario"], r["kind"], r["content_hash"], r["stored_at"], no)
                self._tail_by_id[r["id"]] = r
        for rid, e in self._index.items():
            self._scenario_ids.setdefault(e.scenario, []).append(rid)
        for lst in self._scenario_ids.values():
            lst.sort()
        # Every log but the newest is closed: roll them now so only one log is ever open.
        nos = sorted(self._tail)
        for no in nos[:-1]:
            self._write_segment(self._tail[no])
            self._publish_segment(self._tail[no])
        last = nos[-1] if nos else max(self._segments, default=0) + 1
        if last in self._segments:
            last += 1
        self._tail.setdefault(last, _Chunk(last, []))
        self._open_log(last)

    def _open_log(self, no: int) -> None:
        path = self.folder / f"log-{no:06d}.bin"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._log_no, self._log_size = no, os.fstat(self._fd).st_size
        self._alloc = self._log_size
        _fsync_dir(self.folder)

    # ---- writing --------------------------------------------------------------------------------------------
    def append(self, records: list[Record]) -> list[bool]:
        """Write records durably; returns per record True (written) or False (same id and content existed).

        Raises Conflict (nothing written) when an id exists with other content, StoreUnavailable on I/O failure.
        """
        dicts = [r.to_dict() for r in records]
        now = time.time()
        for d in dicts:
            d["stored_at"] = now
        fresh, new = self._reserve(dicts, now)
        if new:
            self._enqueue(encode_frame(new), new)
        return fresh

    def _reserve(self, dicts: list[dict], now: float) -> tuple[list[bool], list[dict]]:
        """Check ids against the index and reserve the new ones, so a concurrent duplicate sees them."""
        with self._lock:
            if self._broken:
                raise StoreUnavailable(self._broken)
            fresh, seen = [], set()
            for d in dicts:
                e = self._index.get(d["id"])
                if e is None and d["id"] in seen:
                    raise Conflict(f"record id {d['id']!r} appears twice in one write")
                if e is not None and e.content_hash != d["content_hash"]:
                    raise Conflict(f"record id {d['id']!r} already exists with different content")
                fresh.append(e is None)
                seen.add(d["id"])
            new = [d for d, is_new in zip(dicts, fresh, strict=True) if is_new]
            for d in new:
                self._index[d["id"]] = IndexEntry(d["scenario"], d["kind"], d["content_hash"], now, -1)
        return fresh, new

    def _enqueue(self, frame: bytes, new: list[dict]) -> None:
        """Join the open batch; return once it is durable (raises StoreUnavailable when its write failed)."""
        with self._lock:
            batch = self._open
            batch.frames.append(frame)
            batch.records.extend(new)
            if not self._flushing:
                self._flushing = True
                self._open = _Batch()
                gate = None
            else:
                gate = _allocate_lock()
                gate.acquire()
                batch.waiters.append(gate)
        if gate is not None:
            gate.acquire()  # released by the committer: the batch is durable, or this thread now leads it
        if not batch.durable:
            self._commit(batch)
        if batch.error is not None:
            raise StoreUnavailable(batch.error)

    def _commit(self, batch: "_Batch") -> None:
        """Write and fsync one batch (lock not held), then wake its waiters and promote the next batch.

        Only one thread commits at a time (`_flushing`); appends that arrive meanwhile gather in the open
        batch, and one of them is woken to commit it, so each waiter wakes once and one fsync serves them all.
        """
        data = b"".join(batch.frames)
        start, err, t0 = self._log_size, None, time.perf_counter()
        try:
            if start + len(data) > self._alloc:
                # Write zeros ahead: an fdatasync of blocks that already exist changes no metadata, so it skips
                # writing the new file size an append costs (a journal commit, or the inode on a journal-less
                # ext4 like this VM's): 0.15 against 0.21 ms on this disk.
                grow = max(PREALLOCATE, len(data))
                os.pwrite(self._fd, bytes(grow), self._alloc)
                self._alloc += grow
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], start + written)
            os.fdatasync(self._fd)  # data (and size, after growing): all an append needs to survive
            self.stats["sync_s"] += time.perf_counter() - t0
        except OSError as e:
            err = f"record store write failed: {e}"
            log.error("%s; cutting the log back to %d bytes", err, start)
            try:
                os.ftruncate(self._fd, start)
                self._alloc = start
                os.fsync(self._fd)
            except OSError as e2:
                self._broken = f"record store is unavailable after a failed write ({e}; {e2}); restart the server"
        with self._lock:
            if err is None:
                self._log_size += len(data)
                self._committed(batch.records)
            else:
                for d in batch.records:
                    self._index.pop(d["id"], None)
                batch.error = err
            batch.durable = True
            nxt = self._open
            if nxt.frames:
                self._open = _Batch()
                nxt.waiters.pop(0).release()  # promoted: that appender commits the batch it joined
            else:
                self._flushing = False
                self._idle.notify_all()
        for gate in batch.waiters:
            gate.release()

    def _committed(self, recs: list[dict]) -> None:
        """Lock held: index records that are now durable in the open log; rotate it when full."""
        self._index_durable(self._log_no, recs)
        self._count_commit(recs)
        if len(self._tail[self._log_no].records) >= self.roll_records or self._log_size >= self.roll_bytes:
            self._rotate()

    def _count_commit(self, recs: list[dict]) -> None:
        self.stats["commits"] += 1
        self.stats["records_written"] += len(recs)
        self.stats["max_group"] = max(self.stats["max_group"], len(recs))

    def _index_durable(self, no: int, recs: list[dict]) -> None:
        for d in recs:
            e = self._index.get(d["id"])
            if e is None:  # a relay's record (see follow_relays)
                self._index[d["id"]] = IndexEntry(d["scenario"], d["kind"], d["content_hash"], d["stored_at"], no)
            else:
                e.chunk = no
            self._tail_by_id[d["id"]] = d
            ids = self._scenario_ids.setdefault(d["scenario"], [])
            if ids and ids[-1] > d["id"]:
                bisect.insort(ids, d["id"])  # a client-chosen id, or ids minted out of order
            else:
                ids.append(d["id"])
        self._tail[no].records.extend(recs)

    def _rotate(self) -> None:
        """Lock held: close the current log, hand its chunk to the roller, open the next log."""
        chunk = self._tail[self._log_no]
        os.close(self._fd)
        nxt, self._fd = create_log(self.folder)
        self._tail[nxt] = _Chunk(nxt, [])
        self._log_no, self._log_size, self._alloc = nxt, 0, 0
        self._roll_queue.append(chunk)
        self._roll_wake.notify()

    # ---- rolling into Parquet -------------------------------------------------------------------------------
    def _write_segment(self, chunk: _Chunk) -> Path:
        path = self.folder / f"seg-{chunk.no:06d}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        log_to_frame(self.folder / f"log-{chunk.no:06d}.bin", chunk.records).write_parquet(
            tmp, compression="zstd", statistics=True)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.folder)
        return path

    def _publish_segment(self, chunk: _Chunk) -> None:
        """Lock held (or single-threaded at start): serve the chunk from its segment, drop its log."""
        self._segments[chunk.no] = self.folder / f"seg-{chunk.no:06d}.parquet"
        self._tail.pop(chunk.no, None)
        for r in chunk.records:
            self._tail_by_id.pop(r["id"], None)
        (self.folder / f"log-{chunk.no:06d}.bin").unlink(missing_ok=True)
        self.stats["rolls"] += 1

    def _roll_loop(self) -> None:
        while True:
            if self._following:
                try:
                    self.follow()
                except Exception:  # noqa: BLE001 - logged; the next look (a query, or a second later) retries
                    log.exception("reading the relay workers' logs failed; will retry")
            with self._lock:
                if not self._roll_queue and not self._closed:
                    self._roll_wake.wait(1.0 if self._following else None)
                if not self._roll_queue and self._closed:
                    return
                if not self._roll_queue:
                    continue
                chunk = self._roll_queue[0]
            try:
                self._write_segment(chunk)
            except Exception:  # the log stays on disk and is rolled again at the next start
                log.exception("rolling log %06d into Parquet failed; will retry", chunk.no)
                self.stats["roll_errors"] += 1
                time.sleep(5)
                continue
            with self._lock:
                self._roll_queue.pop(0)
                self._publish_segment(chunk)

    # ---- following relay workers' logs ----------------------------------------------------------------------
    def follow_relays(self) -> None:
        """Serve the records of relay workers too (server/workers.py): their logs are read as they grow (before
        every query, on an unknown id, and each second) and rolled into Parquet here once closed."""
        self._following = True
        with self._lock:
            self._roll_wake.notify()

    def follow(self) -> None:
        """Read what relays appended since the last look; queue the logs they closed for rolling."""
        if not self._following:
            return
        with self._follow_lock:
            logs, _ = _list_files(self.folder)
            with self._lock:
                mine = set(self._tail) - set(self._followed)
            for no, path in sorted(logs.items()):
                if no in mine:
                    continue
                f = self._followed.get(no)
                if f is None:
                    try:
                        f = _Follow(os.open(path, os.O_RDONLY))
                    except FileNotFoundError:
                        continue
                    with self._lock:
                        self._followed[no] = f
                        self._tail[no] = _Chunk(no, [])
                try:  # a free lock means the relay is done with this log: read its last frames and roll it
                    fcntl.flock(f.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    closed = True
                except BlockingIOError:
                    closed = False
                size = os.fstat(f.fd).st_size
                recs = []
                want = 1 << 16
                while f.offset + _HEADER.size <= size:  # in slices: a relay's log ends in preallocated zeros
                    if not _HEADER.unpack(os.pread(f.fd, _HEADER.size, f.offset))[0]:
                        break  # nothing new: one 8-byte read, not a slice of zeros, per look
                    data = os.pread(f.fd, min(size - f.offset, want), f.offset)
                    payloads, good = _payloads(data)
                    if not good:
                        length = _HEADER.unpack_from(data)[0] if len(data) >= _HEADER.size else 0
                        if length and _HEADER.size + length > want:  # a frame larger than the slice
                            want = _HEADER.size + length
                            continue
                        break
                    want = 1 << 16
                    for p in payloads:
                        obj = orjson.loads(p)
                        recs.extend(obj) if isinstance(obj, list) else recs.append(obj)
                    f.offset += good
                if recs:
                    with self._lock:
                        self._index_durable(no, recs)
                if closed:
                    if f.offset < size and _is_torn(path, f.offset):
                        # the relay died mid-write: nothing past here was acknowledged
                        log.warning("relay log %s: cutting a torn tail of %d bytes", path.name, size - f.offset)
                    if f.offset < size:
                        os.truncate(path, f.offset)
                    os.close(f.fd)
                    with self._lock:
                        del self._followed[no]
                        self._roll_queue.append(self._tail[no])
                        self._roll_wake.notify()

    # ---- reading --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._index)

    def entry(self, record_id: str) -> IndexEntry | None:
        e = self._index.get(record_id)
        if e is None and self._following:
            self.follow()
            e = self._index.get(record_id)
        return None if e is None or e.chunk < 0 else e

    def get(self, record_id: str) -> dict | None:
        if self._following and record_id not in self._index:
            self.follow()
        with self._lock:
            e = self._index.get(record_id)
            if e is None or e.chunk < 0:
                return None
            r = self._tail_by_id.get(record_id)
            if r is not None:
                return r
            seg = self._segments.get(e.chunk)
        df = scan_segments([seg]).filter(pl.col("id") == record_id).collect()
        return frame_row_to_dict(df.row(0, named=True)) if len(df) else None

    def get_many(self, record_ids: list[str]) -> list[dict]:
        """Records by id, in the order given (unknown ids are skipped); one Parquet scan per segment touched."""
        found: dict[str, dict] = {}
        by_segment: dict[Path, list[str]] = {}
        if self._following and any(rid not in self._index for rid in record_ids):
            self.follow()
        with self._lock:
            for rid in record_ids:
                e = self._index.get(rid)
                if e is None or e.chunk < 0:
                    continue
                if rid in self._tail_by_id:
                    found[rid] = self._tail_by_id[rid]
                elif e.chunk in self._segments:
                    by_segment.setdefault(self._segments[e.chunk], []).append(rid)
        for seg, ids in by_segment.items():
            for row in scan_segments([seg]).filter(pl.col("id").is_in(ids)).collect().iter_rows(named=True):
                found[row["id"]] = frame_row_to_dict(row)
        return [found[rid] for rid in record_ids if rid in found]

    def scan(self) -> pl.LazyFrame:
        """A consistent LazyFrame over all records (segments plus the in-memory tail of unrolled logs)."""
        self.follow()
        with self._lock:
            paths = [p for _, p in sorted(self._segments.items())]
            tails = [c.as_frame() for _, c in sorted(self._tail.items()) if c.records]
        return scan_segments(paths, tails)

    def ids(self, scenario: str | None = None, kind: str | None = None, since: float = 0.0) -> list[str]:
        """Durable ids in sorted order (server ids sort by time), filtered by scenario, kind and write time."""
        return self.page(scenario, kind, since, None, None)[0]

    def page(self, scenario: str | None, kind: str | None, since: float, after: str | None,
             limit: int | None) -> tuple[list[str], str | None]:
        """Up to `limit` ids after `after` and the cursor of the next page (None at the end). Walks one
        scenario's sorted ids from the cursor, so a page costs about `limit` steps, not the store's size."""
        self.follow()
        with self._lock:
            if scenario is None:
                ids = sorted(rid for rid, e in self._index.items() if e.chunk >= 0)
            else:
                ids = self._scenario_ids.get(scenario, [])
            idx, out = self._index, []
            for i in range(bisect.bisect_right(ids, after) if after else 0, len(ids)):
                e = idx[ids[i]]
                if (kind is None or e.kind == kind) and e.stored_at >= since:
                    if limit is not None and len(out) == limit:
                        return out, out[-1]
                    out.append(ids[i])
            return out, None

    def forget(self, scenario: str) -> int:
        """Drop a deleted scenario's records from the index (they stay on disk, append-only)."""
        with self._lock:
            gone = self._scenario_ids.pop(scenario, [])
            gone += [rid for rid, e in self._index.items() if e.scenario == scenario and e.chunk < 0]
            for rid in gone:
                self._index.pop(rid, None)
        return len(gone)

    def info(self) -> dict:
        self.follow()
        with self._lock:
            return {"records": len(self._index), "segments": len(self._segments),
                    "log_records": sum(len(c.records) for c in self._tail.values()), "log_bytes": self._log_size,
                    "broken": self._broken, **self.stats}

    def _settle(self) -> bool:
        """Lock held: wait until no commit runs; False when the store is closed already."""
        if self._closed:
            return False
        while self._flushing:
            self._idle.wait()
        return True

    def close(self) -> None:
        """Roll the open log into Parquet and stop the roller (a crash instead of close loses nothing either)."""
        with self._lock:
            if not self._settle():
                return
            if self._tail.get(self._log_no) and self._tail[self._log_no].records:
                self._rotate()
            self._closed = True
            self._roll_wake.notify()
        self._roller.join(timeout=60)
        os.close(self._fd)
        for f in self._followed.values():
            os.close(f.fd)


class RelayLog(RecordStore):
    """A relay worker's own record log (server/workers.py): group commit and fdatasync as in RecordStore, and
    nothing else. The primary follows the log (`follow_relays`), indexes and serves its records and rolls it
    into Parquet once the relay has moved on to a new log (or died)."""

    def __init__(self, data_dir: str | Path, roll_records: int = 20_000, roll_bytes: int = 64 << 20):
        self.folder = Path(data_dir) / "records"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.roll_records, self.roll_bytes = roll_records, roll_bytes
        self._lock = threading.Lock()
        self._index: dict[str, IndexEntry] = {}  # stays empty: ids here are minted, never client-chosen
        self._open = _Batch()
        self._idle = threading.Condition(self._lock)
        self._flushing = False
        self._broken: str | None = None
        self._closed = False
        self.stats = {"commits": 0, "records_written": 0, "max_group": 0, "sync_s": 0.0}
        self._fd, self._count = -1, 0
        self._new_log()

    def _new_log(self) -> None:
        old = self._fd
        self._log_no, self._fd = create_log(self.folder)
        self._log_size, self._alloc, self._count = 0, 0, 0
        if old >= 0:
            os.close(old)  # frees its lock: the primary reads it to the end and rolls it

    def _reserve(self, dicts: list[dict], now: float) -> tuple[list[bool], list[dict]]:
        if self._broken:
            raise StoreUnavailable(self._broken)
        return [True] * len(dicts), dicts

    def _committed(self, recs: list[dict]) -> None:
        self._count += len(recs)
        self._count_commit(recs)
        if self._count >= self.roll_records or self._log_size >= self.roll_bytes:
            self._new_log()

    def close(self) -> None:
        with self._lock:
            if self._settle():
                self._closed = True
                os.close(self._fd)
