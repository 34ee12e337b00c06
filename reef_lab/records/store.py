"""The record store: durable before the receipt leaves, Parquet for everything after.

Writes go to an append-only log (`records/log-NNNNNN.bin`, frames of `<len u32><crc32 u32><rows>`, see
encode_frame) with group commit: concurrent appenders queue their frames, the first one in becomes the leader,
writes everybody's frames with one `write` and one `fsync`, and wakes the rest. `append` returns only once its
records are on disk, so a receipt is never handed out for a record that `kill -9` (or a power cut) could lose.

When a log grows past `roll_records`/`roll_bytes` it is closed and a background thread rolls it into a Parquet
segment (`records/seg-NNNNNN.parquet`, written via polars, fsynced, renamed into place), indexes the segment's rows
(reef_lab/records/index.py, on disk) and deletes the log. Memory holds no record itself: a record not yet rolled is
indexed by its place in its log and read back with one `pread`, a rolled one by its segment and row, so resident
memory stays flat under steady traffic and a read by id costs the same before and after a restart.
Opening a store recovers from any crash point: a torn log tail is cut at the last good frame, a log whose segment
exists is deleted, a closed log without one is rolled. `scan_records(data_dir)` gives a polars LazyFrame over
segments plus logs and is safe to call from another process while a server writes.
"""

from __future__ import annotations

import bisect
import fcntl
import heapq
import io
import itertools
import logging
import mmap
import os
import re
import struct
import threading
import time
import zlib
from _thread import allocate_lock as _allocate_lock
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import orjson
import polars as pl

from reef_lab.errors import Conflict, StoreUnavailable
from reef_lab.records.index import SegmentIndex
from reef_lab.records.record import JSON_COLUMNS, PARQUET_SCHEMA, Record, frame_row_to_dict

log = logging.getLogger("reef_lab.records.store")

_HEADER = struct.Struct("<II")
_ROWS = 1 << 31  # set in a frame's length: its payload is row texts joined by newlines (encode_frame)
PREALLOCATE = 1 << 20  # bytes of zeros written ahead of a log's data (see RecordStore._commit)
SEGMENT_ROW_GROUP = 1024  # rows per Parquet row group: a read by id decodes one (0.8 ms), a scan hardly notices
ROLL_BATCH = 4096  # records parsed at once by a roll: 65 ms per 20,000 records against 153 ms in groups of 1,024
_FILE_RE = re.compile(r"^(log|seg)-(\d{6,})\.(bin|parquet)$")


def row_text(d: dict) -> bytes:
    """A record dict as the JSON text of its Parquet row: JSON-valued fields (request, response, ...) as their
    JSON text in a string. The log holds records this way so rolling it is one pass of polars' JSON reader."""
    row = dict(d)
    for k in JSON_COLUMNS:
        if (v := row[k]) is not None:
            row[k] = orjson.dumps(v).decode()
    return orjson.dumps(row)


def parse_row(text: bytes) -> dict:
    """A record dict from its row's JSON text (see row_text)."""
    return frame_row_to_dict(orjson.loads(text))


def encode_frame(rows: list[bytes]) -> bytes:
    """One frame for one write: several records share a frame (and its CRC), so they land all or nothing. The
    payload is the records' row texts (row_text) joined by newlines (orjson's JSON text holds none), so a reader
    splits a frame into records without parsing them. The length's top bit marks this layout."""
    payload = b"\n".join(rows)
    return _HEADER.pack(len(payload) | _ROWS, zlib.crc32(payload)) + payload


def _frames(data: bytes) -> tuple[list[bytes], list[int], int, bool]:
    """The row texts of a log's intact frames, each one's byte offset in `data`, the offset where intact data ends
    (a torn tail starts there), and whether any frame was in the layout of before 2026-12 (JSON, re-encoded here as
    row texts, so their offsets are -1)."""
    out, offsets, pos, n, legacy = [], [], 0, len(data), False
    while pos + _HEADER.size <= n:
        length, crc = _HEADER.unpack_from(data, pos)
        rows, length = length & _ROWS, length & ~_ROWS
        end = pos + _HEADER.size + length
        if length == 0 or end > n:  # zeros: the log's preallocated, not yet written space
            break
        payload = data[pos + _HEADER.size:end]
        if zlib.crc32(payload) != crc:
            break
        if rows:
            at = pos + _HEADER.size
            for line in payload.split(b"\n"):
                out.append(line)
                offsets.append(at)
                at += len(line) + 1
        else:  # written before 2026-12: one record's JSON, or a JSON array of them, with JSON-valued fields as JSON
            records = orjson.loads(payload)
            for r in records if isinstance(records, list) else [records]:
                out.append(row_text(r))
                offsets.append(-1)
            legacy = True
        pos = end
    return out, offsets, pos, legacy


# What the index needs of a record, read from its JSON text without parsing it: Record.to_dict puts id, scenario
# and kind first and stored_at, content_hash, schema_version last, and orjson writes no spaces. Anchored at both
# ends and without quotes or backslashes inside the strings, a match can only be those top-level members; any
# record that does not match (an escaped id, an old schema) is parsed instead.
_KEY_HEAD = re.compile(rb'\{"id":"([^"\\]*)","scenario":"([^"\\]*)","kind":"([^"\\]*)",')
_KEY_TAIL = re.compile(rb',"stored_at":(-?[0-9][0-9.eE+-]*),"content_hash":"([^"\\]*)","schema_version":[0-9]+\}\Z')
Key = tuple[str, str, str, str, float]  # id, scenario, kind, content_hash, stored_at


def _known_key(line: bytes, known: dict | None) -> Key:
    """A row's index key: from the in-memory index entry when there is one (no parsing), else from its text."""
    e = known.get(line[7:line.index(b'"', 7)].decode()) if known and line.startswith(b'{"id":"') else None
    return (line[7:line.index(b'"', 7)].decode(), e.scenario, e.kind, e.content_hash, e.stored_at) if e else \
        record_key(line)


def record_key(line: bytes) -> Key:
    head, tail = _KEY_HEAD.match(line), _KEY_TAIL.search(line, len(line) - 160)
    if head and tail:
        return (head[1].decode(), head[2].decode(), head[3].decode(), tail[2].decode(), float(tail[1]))
    d = orjson.loads(line)
    return d["id"], d["scenario"], d["kind"], d.get("content_hash") or "", d.get("stored_at") or d["created_at"]


def iter_log_rows(path: Path) -> Iterator[bytes]:
    """The row texts of a log's intact frames, one at a time from a memory map: a roll holds one row group's
    records in memory, not the log's."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _HEADER.size:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            while pos + _HEADER.size <= size:
                length = _HEADER.unpack_from(mm, pos)[0] & ~_ROWS
                end = pos + _HEADER.size + length
                if length == 0 or end > size:
                    return
                rows, _, good, _ = _frames(mm[pos:end])  # one frame: checked, split, old layout re-encoded
                if not good:
                    return
                yield from rows
                pos = end


def _batched(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while group := list(itertools.islice(it, n)):
        yield group


def log_lines(path: Path) -> tuple[list[bytes], int]:
    """The row text of every intact record of a log, and the byte offset where intact data ends."""
    lines, _, good, _ = _frames(path.read_bytes())
    return lines, good


def read_log(path: Path) -> tuple[list[dict], int]:
    """All intact records of a log and the byte offset where intact data ends."""
    lines, good = log_lines(path)
    return [parse_row(line) for line in lines], good


def lines_to_frame(lines: list[bytes]) -> pl.DataFrame:
    """Records' row texts (row_text) in the Parquet layout, parsed by polars' JSON reader in Rust, off the GIL:
    rolling a 20,000-record log holds the GIL for milliseconds, not the ~0.3 s of building the frame in Python.
    (JSON-valued fields are text in the log because polars, asked to read a nested value as text, does not always
    write back the same JSON: a backslash or tab in a string comes out unescaped, 1.5e300 as an integer.)"""
    if not lines:
        return pl.DataFrame(schema=PARQUET_SCHEMA)
    return pl.read_ndjson(io.BytesIO(b"\n".join(lines)), schema=PARQUET_SCHEMA)


def _is_torn(path: Path, good: int) -> bool:
    """Whether a log holds more than zeros (its preallocated space) after its last intact frame."""
    with open(path, "rb") as f:
        f.seek(good)
        while chunk := f.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return True
    return False


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
    log_texts = {}
    for no, path in sorted(logs.items()):
        try:
            log_texts[no] = log_lines(path)[0]
        except FileNotFoundError:  # rolled away meanwhile: its segment is listed below
            continue
    _, segs = _list_files(folder)
    tail = [line for no, lines in sorted(log_texts.items()) if no not in segs for line in lines]
    return scan_segments([segs[no] for no in sorted(segs)], lines_to_frame(tail) if tail else None)


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


class _Chunk:
    """The records of one log file that are not yet in a Parquet segment: their ids in log order, and a read-only
    descriptor of the log, from which a record is read by the place its index entry names.

    Why not the records themselves: held in memory until their roll (20,000 records), a busy server's resident
    memory grew by about 10 MB a minute and fell back at each roll; in the log they are in the page cache anyway.
    """

    __slots__ = ("no", "ids", "fd")

    def __init__(self, no: int, path: Path | None = None):
        self.no, self.ids = no, []
        self.fd = os.open(path, os.O_RDONLY) if path is not None else -1


class _Batch:
    """Appends that share one write and one fsync.

    Each appender that does not lead parks on its own pre-acquired lock; the committer releases exactly those
    locks when the batch is durable (or releases one of them to promote its owner to leader of the next batch).
    A shared Condition instead made every woken waiter queue again for the store's lock, one after another, and
    under the GIL that herd cost more CPU than the fsync it waited for (scripts/bench_gateway.py).
    """

    __slots__ = ("frames", "keys", "lines", "waiters", "durable", "error")

    def __init__(self):
        self.frames: list[bytes] = []
        self.keys: list[Key] = []
        self.lines: list[list[bytes]] = []  # each frame's row texts
        self.waiters: list = []  # one acquired lock per parked appender
        self.durable = False
        self.error: str | None = None


class IndexEntry:
    """Where a record is and what the index needs of it. `chunk` is the log (not yet rolled) or the segment
    that holds it, -1 while its write is in flight; `pos`/`size` its row text's place in a log, or `pos` its row
    in a segment."""

    __slots__ = ("scenario", "kind", "content_hash", "stored_at", "chunk", "pos", "size")

    def __init__(self, scenario: str, kind: str, content_hash: str, stored_at: float, chunk: int, pos: int = -1,
                 size: int = 0):
        self.scenario, self.kind, self.content_hash, self.stored_at = scenario, kind, content_hash, stored_at
        self.chunk, self.pos, self.size = chunk, pos, size


class RecordStore:
    """Append-only, group-committed, crash-safe record storage for one data dir."""

    KEEPS_PLACES = True  # indexes each record by its place in the log (a relay's log does not: its primary does)

    def __init__(self, data_dir: str | Path, roll_records: int = 20_000, roll_bytes: int = 64 << 20):
        self.folder = Path(data_dir) / "records"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.roll_records, self.roll_bytes = roll_records, roll_bytes
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # a log's read descriptor closes only while no read uses it
        self._index: dict[str, IndexEntry] = {}  # records not yet rolled (and writes in flight)
        self._scenario_ids: dict[str, list[str]] = {}  # their durable ids per scenario, sorted
        self._tail: dict[int, _Chunk] = {}
        self._segments: dict[int, Path] = {}
        self._rolled: SegmentIndex | None = None
        self._open = _Batch()
        self._idle = threading.Condition(self._lock)  # notified when no commit is running
        self._flushing = False
        self._broken: str | None = None
        self.stats = {"commits": 0, "records_written": 0, "max_group": 0, "sync_s": 0.0, "rolls": 0, "roll_errors": 0}
        self._followed: dict[int, _Follow] = {}
        self._following = False
        self._follow_lock = threading.Lock()
        self._roll_queue: list[_Chunk] = []
        self._roll_wake = threading.Condition(self._lock)
        self._recover()
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
        self._rolled = SegmentIndex(self.folder / "index.sqlite")
        indexed = self._rolled.segments()
        self._rolled.drop_segments(indexed - set(self._segments))
        for no in sorted(set(self._segments) - indexed):  # a crash before its index commit, or an older data dir
            self._index_segment(no)
        parsed = {}
        for no, path in sorted(logs.items()):
            lines, offsets, good, legacy = _frames(path.read_bytes())
            if good < path.stat().st_size:
                if _is_torn(path, good):
                    log.warning("record log %s: cutting a torn tail of %d bytes", path.name,
                                path.stat().st_size - good)
                with open(path, "r+b") as f:
                    f.truncate(good)
                    os.fsync(f.fileno())
            parsed[no] = (lines, offsets, legacy)
        # Every log's records serve from the log as before the restart; all but the newest are closed and go to
        # the roller. A log with frames of the old layout is rolled now (its records have no row text to read).
        nos = sorted(parsed)
        for no in nos:
            lines, offsets, legacy = parsed[no]
            if legacy:
                self._roll_now(no, lines)
                continue
            self._tail[no] = _Chunk(no, logs[no])
            self._index_durable(no, [record_key(line) for line in lines], lines, offsets)
            if no != nos[-1]:
                self._roll_queue.append(self._tail[no])
        last = nos[-1] if nos and nos[-1] in self._tail else max([*self._segments, *nos], default=0) + 1
        if last not in self._tail:
            self._tail[last] = _Chunk(last)
        self._open_log(last)

    def _roll_now(self, no: int, lines: list[bytes]) -> None:
        """At start: roll a closed log whose records were read back, then drop it."""
        self._write_segment(no, lines)
        self._segments[no] = self.folder / f"seg-{no:06d}.parquet"
        self._index_segment(no)
        (self.folder / f"log-{no:06d}.bin").unlink(missing_ok=True)
        _fsync_dir(self.folder)

    def _index_segment(self, no: int) -> None:
        df = _conform(pl.scan_parquet(self._segments[no])).select(
            "id", "scenario", "kind", "content_hash", pl.coalesce("stored_at", "created_at")).collect()
        self._rolled.add_segment(no, [(rid, sc, kind, h or "", ts, no, row)
                                      for row, (rid, sc, kind, h, ts) in enumerate(df.iter_rows())], reindex=True)

    def _open_log(self, no: int) -> None:
        path = self.folder / f"log-{no:06d}.bin"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._log_no, self._log_size = no, os.fstat(self._fd).st_size
        self._alloc = self._log_size
        if self._tail[no].fd < 0:
            self._tail[no].fd = os.open(path, os.O_RDONLY)
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
            lines = [row_text(d) for d in new]
            self._enqueue(encode_frame(lines), [(d["id"], d["scenario"], d["kind"], d["content_hash"], now)
                                                for d in new], lines)
        return fresh

    def _reserve(self, dicts: list[dict], now: float) -> tuple[list[bool], list[dict]]:
        """Check ids against the index and reserve the new ones, so a concurrent duplicate sees them. Server ids
        (no content hash: 80 random bits, never repeated) are not looked up among rolled records."""
        chosen = [d["id"] for d in dicts if d["content_hash"]]
        with self._lock:  # the rolled index is asked under the lock too: a roll cannot move an id in between
            rolled = self._rolled.get_many(chosen) if chosen else {}
            if self._broken:
                raise StoreUnavailable(self._broken)
            fresh, seen = [], set()
            for d in dicts:
                e = self._index.get(d["id"])
                h = e.content_hash if e is not None else rolled[d["id"]][3] if d["id"] in rolled else None
                if h is None and d["id"] in seen:
                    raise Conflict(f"record id {d['id']!r} appears twice in one write")
                if h is not None and h != d["content_hash"]:
                    raise Conflict(f"record id {d['id']!r} already exists with different content")
                fresh.append(h is None)
                seen.add(d["id"])
            new = [d for d, is_new in zip(dicts, fresh, strict=True) if is_new]
            for d in new:
                self._index[d["id"]] = IndexEntry(d["scenario"], d["kind"], d["content_hash"], now, -1)
        return fresh, new

    def _enqueue(self, frame: bytes, keys: list[Key], lines: list[bytes]) -> None:
        """Join the open batch; return once it is durable (raises StoreUnavailable when its write failed)."""
        with self._lock:
            batch = self._open
            batch.frames.append(frame)
            batch.keys += keys
            batch.lines.append(lines)
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
        if err is None and self.KEEPS_PLACES:  # where each row text landed, worked out before taking the lock
            lines, offsets, at = [], [], start
            for frame, rows in zip(batch.frames, batch.lines, strict=True):
                pos = at + _HEADER.size
                for line in rows:
                    lines.append(line)
                    offsets.append(pos)
                    pos += len(line) + 1
                at += len(frame)
        else:
            lines = offsets = []
        with self._lock:
            if err is None:
                self._log_size += len(data)
                self._committed(batch.keys, lines, offsets)
            else:
                for k in batch.keys:
                    self._index.pop(k[0], None)
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

    def _committed(self, keys: list[Key], lines: list[bytes], offsets: list[int]) -> None:
        """Lock held: index records that are now durable in the open log; rotate it when full."""
        self._index_durable(self._log_no, keys, lines, offsets)
        self._count_commit(len(keys))
        if len(self._tail[self._log_no].ids) >= self.roll_records or self._log_size >= self.roll_bytes:
            self._rotate()

    def _count_commit(self, n: int) -> None:
        self.stats["commits"] += 1
        self.stats["records_written"] += n
        self.stats["max_group"] = max(self.stats["max_group"], n)

    def _index_durable(self, no: int, keys: list[Key], lines: list[bytes], offsets: list[int]) -> None:
        """Lock held: serve these records (durable in log `no` at `offsets`) from the log."""
        for (rid, scenario, kind, h, stored_at), line, at in zip(keys, lines, offsets, strict=True):
            e = self._index.get(rid)
            if e is None:  # a relay's record (see follow_relays), or one read back at recovery
                self._index[rid] = IndexEntry(scenario, kind, h, stored_at, no, at, len(line))
            else:
                e.chunk, e.pos, e.size = no, at, len(line)
            ids = self._scenario_ids.setdefault(scenario, [])
            if ids and ids[-1] > rid:
                bisect.insort(ids, rid)  # a client-chosen id, or ids minted out of order
            else:
                ids.append(rid)
        self._tail[no].ids += [k[0] for k in keys]

    def _rotate(self) -> None:
        """Lock held: close the current log, hand its chunk to the roller, open the next log."""
        chunk = self._tail[self._log_no]
        os.close(self._fd)
        nxt, self._fd = create_log(self.folder)
        self._tail[nxt] = _Chunk(nxt, self.folder / f"log-{nxt:06d}.bin")
        self._log_no, self._log_size, self._alloc = nxt, 0, 0
        self._roll_queue.append(chunk)
        self._roll_wake.notify()

    # ---- rolling into Parquet -------------------------------------------------------------------------------
    def _write_segment(self, no: int, rows: Iterable[bytes], known: dict[str, IndexEntry] | None = None
                       ) -> list[Key]:
        """Write the segment a few row groups at a time (ROLL_BATCH records parsed at once, SEGMENT_ROW_GROUP to a
        group), so a roll's memory stays that of one batch (building the whole 20,000-record frame at once left the
        process ~100 MB larger for good); returns the records' index keys in row order, from `known` where the
        index holds them. A read by id decodes one group, not the segment."""
        import pyarrow.parquet as pq  # polars writes no Parquet file a group at a time; pyarrow does

        path = self.folder / f"seg-{no:06d}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        keys: list[Key] = []
        writer = None
        try:
            for group in _batched(rows, ROLL_BATCH):
                keys += [_known_key(line, known) for line in group]
                table = lines_to_frame(group).to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(tmp, table.schema, compression="zstd", write_statistics=True)
                writer.write_table(table, row_group_size=SEGMENT_ROW_GROUP)
            if writer is None:  # an empty log: an empty segment, so the log's number is taken
                lines_to_frame([]).write_parquet(tmp)
        finally:
            if writer is not None:
                writer.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.folder)
        return keys

    def _roll(self, chunk: _Chunk) -> None:
        """Roller thread: the closed log's records into a segment and the on-disk index; then serve them from
        there and drop the log."""
        with self._lock:
            ids = list(chunk.ids)
            known = {rid: self._index[rid] for rid in ids if rid in self._index}
        keys = self._write_segment(chunk.no, iter_log_rows(self.folder / f"log-{chunk.no:06d}.bin"), known)
        if len(keys) != len(ids):
            (self.folder / f"seg-{chunk.no:06d}.parquet").unlink()
            _fsync_dir(self.folder)
            raise RuntimeError(f"log {chunk.no:06d} holds {len(keys)} records, its index {len(ids)}")
        self._rolled.add_segment(chunk.no, [(rid, sc, kind, h, at, chunk.no, row)
                                            for row, (rid, sc, kind, h, at) in enumerate(keys)])
        # The follower's lock too: it lists the logs and follows any it does not hold, so the log must leave the
        # tail and the disk in one step (followed again in between, its records were indexed twice and the
        # duplicate roll failed for good).
        with self._follow_lock, self._read_lock, self._lock:
            self._segments[chunk.no] = self.folder / f"seg-{chunk.no:06d}.parquet"
            self._tail.pop(chunk.no, None)
            gone = set(ids)
            for rid in ids:
                self._index.pop(rid, None)
            for scenario in {k[1] for k in keys}:
                lst = self._scenario_ids.get(scenario)
                if lst is not None:
                    lst[:] = [rid for rid in lst if rid not in gone]
            os.close(chunk.fd)
            chunk.fd = -1
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
                self._roll(chunk)
            except Exception:  # noqa: BLE001 - its records still serve from the log; the others roll meanwhile
                log.exception("rolling log %06d into Parquet failed; will retry", chunk.no)
                self.stats["roll_errors"] += 1
                with self._lock:
                    self._roll_queue.remove(chunk)
                    if not self._closed:  # closed: left for the next start, which serves it and tries again
                        self._roll_queue.append(chunk)
                        self._roll_wake.wait(5)
                continue
            with self._lock:
                self._roll_queue.remove(chunk)

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
                        chunk = _Chunk(no, path)
                    except FileNotFoundError:
                        continue
                    with self._lock:
                        self._followed[no] = f
                        self._tail[no] = chunk
                try:  # a free lock means the relay is done with this log: read its last frames and roll it
                    fcntl.flock(f.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    closed = True
                except BlockingIOError:
                    closed = False
                size = os.fstat(f.fd).st_size
                lines, offsets = [], []
                want = 1 << 16
                while f.offset + _HEADER.size <= size:  # in slices: a relay's log ends in preallocated zeros
                    if not _HEADER.unpack(os.pread(f.fd, _HEADER.size, f.offset))[0]:
                        break  # nothing new: one 8-byte read, not a slice of zeros, per look
                    data = os.pread(f.fd, min(size - f.offset, want), f.offset)
                    rows, at, good, _ = _frames(data)
                    if not good:
                        length = _HEADER.unpack_from(data)[0] & ~_ROWS if len(data) >= _HEADER.size else 0
                        if length and _HEADER.size + length > want:  # a frame larger than the slice
                            want = _HEADER.size + length
                            continue
                        break
                    want = 1 << 16
                    lines += rows
                    offsets += [f.offset + a for a in at]
                    f.offset += good
                if lines:
                    keys = [record_key(line) for line in lines]
                    with self._lock:
                        self._index_durable(no, keys, lines, offsets)
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
        with self._lock:
            tail = sum(len(c.ids) for c in self._tail.values())
        return tail + self._rolled.count

    def entry(self, record_id: str) -> IndexEntry | None:
        """What the index knows of a durable record (None if there is none). The relays' logs are looked at only
        for an id neither index knows (a receipt a relay has just handed out)."""
        for attempt in range(2):
            e = self._index.get(record_id)
            if e is not None:
                return None if e.chunk < 0 else e
            row = self._rolled.get(record_id)
            if row is not None:
                return IndexEntry(row[1], row[2], row[3], row[4], row[5], row[6])
            if attempt or not self._following:
                return None
            self.follow()
        return None

    def get(self, record_id: str) -> dict | None:
        found = self.get_many([record_id])
        return found[0] if found else None

    def get_many(self, record_ids: list[str]) -> list[dict]:
        """Records by id, in the order given (unknown ids are skipped): a `pread` each from the logs, one read of
        the row groups that hold them from each segment. The relays' logs are looked at only when an id is in
        neither index."""
        found = self._read(record_ids)
        unknown = [rid for rid in record_ids if rid not in found]
        if unknown and self._following:
            self.follow()
            found.update(self._read(unknown))
        return [found[rid] for rid in record_ids if rid in found]

    def _read(self, record_ids: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        missing = []
        with self._read_lock:
            with self._lock:
                places = []
                for rid in record_ids:
                    e = self._index.get(rid)
                    if e is None:
                        missing.append(rid)
                    elif e.chunk >= 0:
                        places.append((rid, self._tail[e.chunk].fd, e.pos, e.size))
            for rid, fd, pos, size in places:
                found[rid] = parse_row(os.pread(fd, size, pos))
        by_segment: dict[int, list[tuple[int, str]]] = {}
        for rid, row in self._rolled.get_many(missing).items() if missing else ():
            by_segment.setdefault(row[5], []).append((row[6], rid))
        for no, rows in by_segment.items():
            found.update(read_rows(self.folder / f"seg-{no:06d}.parquet", rows))
        return found

    def scan(self) -> pl.LazyFrame:
        """A consistent LazyFrame over all records (segments plus the unrolled logs, read from disk)."""
        self.follow()
        with self._read_lock:
            with self._lock:  # a snapshot: segments never change and a log's indexed records only grow
                paths = [p for _, p in sorted(self._segments.items())]
                parts = [(c.fd, [self._index[rid] for rid in c.ids]) for _, c in sorted(self._tail.items()) if c.ids]
            tails = [lines_to_frame([os.pread(fd, e.size, e.pos) for e in entries]) for fd, entries in parts]
        return scan_segments(paths, tails)

    def ids(self, scenario: str | None = None, kind: str | None = None, since: float = 0.0) -> list[str]:
        """Durable ids in sorted order (server ids sort by time), filtered by scenario, kind and write time."""
        return self.page(scenario, kind, since, None, None)[0]

    def page(self, scenario: str | None, kind: str | None, since: float, after: str | None,
             limit: int | None) -> tuple[list[str], str | None]:
        """Up to `limit` ids after `after` and the cursor of the next page (None at the end): the rolled ones from
        the on-disk index and the others from memory, merged in id order."""
        self.follow()
        want = None if limit is None else limit + 1
        with self._lock:
            if scenario is None:
                ids = sorted(rid for rid, e in self._index.items() if e.chunk >= 0)
            else:
                ids = self._scenario_ids.get(scenario, [])
            idx, recent = self._index, []
            for i in range(bisect.bisect_right(ids, after) if after else 0, len(ids)):
                e = idx.get(ids[i])
                if e is not None and e.chunk >= 0 and (kind is None or e.kind == kind) and e.stored_at >= since:
                    recent.append(ids[i])
                    if want is not None and len(recent) == want:
                        break
        rolled = self._rolled.page(scenario, kind, since, after, want)
        out: list[str] = []
        for rid in heapq.merge(rolled, recent):
            if not out or out[-1] != rid:  # rolled between the two reads: listed by both
                out.append(rid)
        if limit is not None and len(out) > limit:
            return out[:limit], out[limit - 1]
        return out, None

    def forget(self, scenario: str) -> int:
        """Drop a deleted scenario's records from the index (they stay on disk, append-only)."""
        with self._lock:
            gone = self._scenario_ids.pop(scenario, [])
            gone += [rid for rid, e in self._index.items() if e.scenario == scenario and e.chunk < 0]
            for rid in gone:
                self._index.pop(rid, None)
        return len(gone) + self._rolled.forget(scenario)

    def info(self) -> dict:
        self.follow()
        with self._lock:
            tail = sum(len(c.ids) for c in self._tail.values())
            return {"records": tail + self._rolled.count, "segments": len(self._segments), "log_records": tail,
                    "log_bytes": self._log_size, "broken": self._broken, **self.stats}

    def _settle(self) -> bool:
        """Lock held: wait until no commit runs; False when the store is closed already."""
        if self._closed:
            return False
        while self._flushing:
            self._idle.wait()
        return True

    def roll_open_log(self, timeout: float = 60) -> None:
        """Close the open log now (if it holds records) and wait until every closed log is in Parquet: for tools
        and tests that want segments; serving never needs it."""
        with self._lock:
            if not self._settle():
                return
            if self._tail[self._log_no].ids:
                self._rotate()
        deadline = time.monotonic() + timeout
        while self._roll_queue:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self._roll_queue)} logs still wait to be rolled")
            time.sleep(0.01)

    def close(self) -> None:
        """Finish the rolls under way and stop the roller. The open log stays a log: the next start serves its
        records from it as this one did, and rolls it once full (a crash instead of close loses nothing either)."""
        with self._lock:
            if not self._settle():
                return
            self._closed = True
            self._roll_wake.notify()
        self._roller.join(timeout=60)
        os.close(self._fd)
        for f in self._followed.values():
            os.close(f.fd)
        for c in self._tail.values():
            if c.fd >= 0:
                os.close(c.fd)
        self._rolled.close()


def read_rows(path: Path, rows: list[tuple[int, str]]) -> dict[str, dict]:
    """Records at the given rows of one segment: each run of nearby rows is one slice, which decodes only the row
    groups it touches."""
    rows = sorted(rows)
    lf = scan_segments([path])
    out, i = {}, 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1][0] - rows[i][0] < SEGMENT_ROW_GROUP:
            j += 1
        start = rows[i][0]
        df = lf.slice(start, rows[j][0] - start + 1).collect()
        for row, rid in rows[i:j + 1]:
            d = frame_row_to_dict(df.row(row - start, named=True))
            if d["id"] != rid:
                raise RuntimeError(f"segment {path.name} row {row} holds {d['id']!r}, its index says {rid!r}")
            out[rid] = d
        i = j + 1
    return out


class RelayLog(RecordStore):
    """A relay worker's own record log (server/workers.py): group commit and fdatasync as in RecordStore, and
    nothing else. The primary follows the log (`follow_relays`), indexes and serves its records and rolls it
    into Parquet once the relay has moved on to a new log (or died)."""

    KEEPS_PLACES = False

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

    def _committed(self, keys: list[Key], lines: list[bytes], offsets: list[int]) -> None:
        self._count += len(keys)
        self._count_commit(len(keys))
        if self._count >= self.roll_records or self._log_size >= self.roll_bytes:
            self._new_log()

    def close(self) -> None:
        with self._lock:
            if self._settle():
                self._closed = True
                os.close(self._fd)
