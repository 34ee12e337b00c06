"""The record log's format and its writer.

A log (`records/log-NNNNNN.bin`) is a sequence of frames `<len u32><crc32 u32><rows>`, each holding the row texts
(`row_text`: a record's JSON, one per line) of one append; a torn tail (a crash mid-write) fails its CRC and is cut
at the last intact frame. Logs are created flock-ed (`create_log`), so another process can tell a log still being
written from a closed one. `GroupCommitLog` appends to one with group commit and fdatasync.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import mmap
import os
import re
import struct
import threading
import time
import zlib
from _thread import allocate_lock as _allocate_lock
from pathlib import Path
from typing import Iterable, Iterator

import orjson

from reef_lab.errors import StoreUnavailable
from reef_lab.records.record import JSON_COLUMNS, frame_row_to_dict

log = logging.getLogger("reef_lab.records.logfile")

_HEADER = struct.Struct("<II")
_ROWS = 1 << 31  # set in a frame's length: its payload is row texts joined by newlines (encode_frame)
PREALLOCATE = 1 << 20  # bytes of zeros written ahead of a log's data (see RecordStore._commit)
_FILE_RE = re.compile(r"^(log|seg)-(\d{6,})\.(bin|parquet)$")


def row_text(d: dict) -> bytes:
    """A record dict as the JSON text of its Parquet row: JSON-valued fields (request, response, ...) as their
    JSON text in a string. The log holds records this way so rolling it is one pass of polars' JSON reader."""
    row = dict(d)
    for k in JSON_COLUMNS:
        if (v := row[k]) is not None:
            row[k] = json_text(v)
    return orjson.dumps(row)


def json_text(value) -> str:
    """`value` as JSON text. orjson refuses integers beyond 64 bits (a model's tool call may carry one: a calculator
    result of 10^20), so such a value is written by the standard library, digits exact on disk; a reader that parses
    it with orjson gets a float for that number, never an error."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


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



class _Batch:
    """Appends that share one write and one fsync.

    Each appender that does not lead parks on its own pre-acquired lock; the committer releases exactly those
    locks when the batch is durable (or releases one of them to promote its owner to leader of the next batch).
    A shared Condition instead made every woken waiter queue again for the store's lock, one after another, and
    under the GIL that herd cost more CPU than the fsync it waited for (scripts/bench/bench_gateway.py).
    """

    __slots__ = ("frames", "keys", "lines", "waiters", "durable", "error")

    def __init__(self):
        self.frames: list[bytes] = []
        self.keys: list[Key] = []
        self.lines: list[list[bytes]] = []  # each frame's row texts
        self.waiters: list = []  # one acquired lock per parked appender
        self.durable = False
        self.error: str | None = None




class GroupCommitLog:
    """One append-only log file written with group commit: concurrent appenders queue their frames, the first one
    in leads and writes everybody's frames with one `write` and one `fdatasync`, then wakes the rest, so each
    appender returns once its records are on disk. Shared by the primary's store and the relays' logs.

    The owner's lock guards this state too: `on_durable(keys, lines, offsets)` and `on_failed(keys)` run with it
    held, so the owner indexes a batch in the same step that makes it durable. `places`: work out each row text's
    offset in the log (the primary reads records back from there; a relay does not).
    """

    def __init__(self, lock: threading.Lock, stats: dict, on_durable, on_failed, places: bool = True):
        self._lock = lock
        self._idle = threading.Condition(lock)  # notified when no commit is running
        self._open = _Batch()
        self._flushing = False
        self._on_durable, self._on_failed, self._places = on_durable, on_failed, places
        self.stats = stats
        for k in ("commits", "records_written", "max_group"):
            stats.setdefault(k, 0)
        stats.setdefault("sync_s", 0.0)
        self.broken: str | None = None  # set when a failed write could not be undone: no more appends
        self.fd, self.no, self.size, self._alloc = -1, 0, 0, 0

    def switch(self, no: int, fd: int) -> None:
        """Lock held (or before any append): write to log `no` from now on (the caller closes the old one)."""
        self.fd, self.no = fd, no
        self.size = self._alloc = os.fstat(fd).st_size

    def append(self, frame: bytes, keys: list[Key], lines: list[bytes]) -> None:
        """Join the open batch; return once it is durable (raises StoreUnavailable when its write failed)."""
        with self._lock:
            if self.broken:
                raise StoreUnavailable(self.broken)
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

    def settle(self) -> None:
        """Lock held: wait until no commit runs."""
        while self._flushing:
            self._idle.wait()

    def _commit(self, batch: _Batch) -> None:
        """Write and fdatasync one batch (lock not held), then wake its waiters and promote the next batch.

        Only one thread commits at a time (`_flushing`); appends that arrive meanwhile gather in the open
        batch, and one of them is woken to commit it, so each waiter wakes once and one fsync serves them all.
        """
        data = b"".join(batch.frames)
        start, err, t0 = self.size, None, time.perf_counter()
        try:
            if start + len(data) > self._alloc:
                # Write zeros ahead: an fdatasync of blocks that already exist changes no metadata, so it skips
                # writing the new file size an append costs (a journal commit, or the inode on a journal-less
                # ext4), which is measurably cheaper per commit.
                grow = max(PREALLOCATE, len(data))
                os.pwrite(self.fd, bytes(grow), self._alloc)
                self._alloc += grow
            written = 0
            while written < len(data):
                written += os.pwrite(self.fd, data[written:], start + written)
            os.fdatasync(self.fd)  # data (and size, after growing): all an append needs to survive
            self.stats["sync_s"] += time.perf_counter() - t0
        except OSError as e:
            err = f"record store write failed: {e}"
            log.error("%s; cutting the log back to %d bytes", err, start)
            try:
                os.ftruncate(self.fd, start)
                self._alloc = start
                os.fsync(self.fd)
            except OSError as e2:
                self.broken = f"record store is unavailable after a failed write ({e}; {e2}); restart the server"
        if err is None and self._places:  # where each row text landed, worked out before taking the lock
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
                self.size += len(data)
                self.stats["commits"] += 1
                self.stats["records_written"] += len(batch.keys)
                self.stats["max_group"] = max(self.stats["max_group"], len(batch.keys))
                self._on_durable(batch.keys, lines, offsets)
            else:
                self._on_failed(batch.keys)
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
