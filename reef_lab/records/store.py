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

Retention (reef_lab/records/retention.py decides what goes) evicts from rolled segments only, through the methods
of reef_lab/records/eviction.py; the store's part is to recover (a `rewrite-N` marker re-indexes segment N at
open), to keep reads of a segment off its swap (`_segments_rw`), and to keep a record that an append references
while a round is deciding (`_fence`, `epoch`).
"""

from __future__ import annotations

import bisect
import fcntl
import heapq
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import polars as pl

from reef_lab.errors import BadRequest, Conflict, StoreUnavailable
from reef_lab.records.index import SegmentIndex
from reef_lab.records.logfile import (_HEADER, _ROWS, GroupCommitLog, Key, _fsync_dir, _frames, _is_torn,
                                      _list_files, create_log, encode_frame, iter_log_rows, log_lines, parse_row,
                                      read_log, record_key, row_text)
from reef_lab.records.record import Record
from reef_lab.records.eviction import SegmentEviction, SharedLock
from reef_lab.records.segments import _conform, lines_to_frame, read_rows, scan_records, scan_segments, write_segment

__all__ = ["RecordStore", "RelayLog", "IndexEntry", "scan_records", "read_log", "log_lines", "record_key",
           "row_text", "encode_frame"]

log = logging.getLogger("reef_lab.records.store")

@dataclass
class _Follow:
    """A relay's log the primary reads as it grows."""

    fd: int
    offset: int = 0


class _Chunk:
    """The records of one log file that are not yet in a Parquet segment: their ids in log order, and a read-only
    descriptor of the log, from which a record is read by the place its index entry names.

    Why not the records themselves: held in memory until their roll (20,000 records), a busy server's resident
    memory grew steadily and fell back at each roll (results/log/soak-notes.md); in the log they are in the page cache.
    """

    __slots__ = ("no", "ids", "fd")

    def __init__(self, no: int, path: Path | None = None):
        self.no, self.ids = no, []
        self.fd = os.open(path, os.O_RDONLY) if path is not None else -1


class IndexEntry:
    """Where a record is and what the index needs of it. `chunk` is the log (not yet rolled) or the segment
    that holds it, -1 while its write is in flight; `pos`/`size` its row text's place in a log, or `pos` its row
    in a segment."""

    __slots__ = ("scenario", "kind", "content_hash", "stored_at", "chunk", "pos", "size")

    def __init__(self, scenario: str, kind: str, content_hash: str, stored_at: float, chunk: int, pos: int = -1,
                 size: int = 0):
        self.scenario, self.kind, self.content_hash, self.stored_at = scenario, kind, content_hash, stored_at
        self.chunk, self.pos, self.size = chunk, pos, size


class RecordStore(SegmentEviction):
    """Append-only, group-committed, crash-safe record storage for one data dir."""

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
        self.stats = {"rolls": 0, "roll_errors": 0}
        self._log = GroupCommitLog(self._lock, self.stats, self._committed, self._failed)
        self._followed: dict[int, _Follow] = {}
        self._following = False
        self._follow_lock = threading.Lock()
        self._roll_queue: list[_Chunk] = []
        self._roll_wake = threading.Condition(self._lock)
        self.on_roll = None  # called (roller thread) after each log is rolled: retention's cue
        # Retention (see evict): segments' files and index rows change only under _segments_rw alone; `epoch` moves
        # before each eviction, `_fence` holds the ids a round may evict (a reference in an append takes an id out
        # of it), `_evicting` the ids being evicted right now (gone for entry() and for appends already).
        self._segments_rw = SharedLock()
        self.epoch = 0
        self._fence: set[str] = set()
        self._evicting: set[str] = set()
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
        for marker in sorted(self.folder.glob("rewrite-*")):  # a crash while retention rewrote this segment
            no = int(marker.name.removeprefix("rewrite-"))
            if no in self._segments:
                self._index_segment(no)
            marker.unlink()
            _fsync_dir(self.folder)
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
        write_segment(self.folder, no, lines)
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
        self._log.switch(no, os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        if self._tail[no].fd < 0:
            self._tail[no].fd = os.open(path, os.O_RDONLY)
        _fsync_dir(self.folder)

    # ---- writing --------------------------------------------------------------------------------------------
    def append(self, records: list[Record], refs_checked_at: int | None = None) -> list[bool]:
        """Write records durably; returns per record True (written) or False (same id and content existed).

        Raises Conflict (nothing written) when an id exists with other content, StoreUnavailable on I/O failure.
        `refs_checked_at`: the `epoch` at which the caller found the records' references; if retention evicted
        anything since, they are looked up again (BadRequest naming one that is gone).
        """
        dicts = [r.to_dict() for r in records]
        now = time.time()
        for d in dicts:
            d["stored_at"] = now
        fresh, new = self._reserve(dicts, now, refs_checked_at)
        if new:
            lines = [row_text(d) for d in new]
            self._log.append(encode_frame(lines), [(d["id"], d["scenario"], d["kind"], d["content_hash"], now)
                                                for d in new], lines)
        return fresh

    def _reserve(self, dicts: list[dict], now: float, refs_checked_at: int | None = None
                 ) -> tuple[list[bool], list[dict]]:
        """Check ids against the index and reserve the new ones, so a concurrent duplicate sees them. Server ids
        (no content hash: 80 random bits, never repeated) are not looked up among rolled records."""
        chosen = [d["id"] for d in dicts if d["content_hash"]]
        with self._lock:  # the rolled index is asked under the lock too: a roll cannot move an id in between
            rolled = self._rolled.get_many(chosen) if chosen else {}
            if self._log.broken:
                raise StoreUnavailable(self._log.broken)
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
            if refs_checked_at is not None and refs_checked_at != self.epoch:
                self._recheck_references(new)
            if self._fence:  # referenced now: no longer this round's to evict
                for d in new:
                    if d["references"]:
                        self._fence.difference_update(d["references"])
            for d in new:
                self._index[d["id"]] = IndexEntry(d["scenario"], d["kind"], d["content_hash"], now, -1)
        return fresh, new

    def _recheck_references(self, dicts: list[dict]) -> None:
        """Lock held: retention evicted records since the caller checked these references; are they still here?"""
        batch = {d["id"] for d in dicts}
        for d in dicts:
            for r in d["references"] or ():
                if r in batch or (r not in self._evicting and (r in self._index or self._rolled.get(r))):
                    continue
                raise BadRequest(f"reference {r!r} is not a known receipt (retention has evicted it)")

    def _committed(self, keys: list[Key], lines: list[bytes], offsets: list[int]) -> None:
        """Lock held: index records that are now durable in the open log; rotate it when full."""
        self._index_durable(self._log.no, keys, lines, offsets)
        if len(self._tail[self._log.no].ids) >= self.roll_records or self._log.size >= self.roll_bytes:
            self._rotate()

    def _failed(self, keys: list[Key]) -> None:
        """Lock held: a batch's write failed (nothing of it is in the log): its reserved ids are free again."""
        for k in keys:
            self._index.pop(k[0], None)

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
        chunk = self._tail[self._log.no]
        os.close(self._log.fd)
        nxt, fd = create_log(self.folder)
        self._tail[nxt] = _Chunk(nxt, self.folder / f"log-{nxt:06d}.bin")
        self._log.switch(nxt, fd)
        self._roll_queue.append(chunk)
        self._roll_wake.notify()

    # ---- rolling into Parquet -------------------------------------------------------------------------------
    def _roll(self, chunk: _Chunk) -> None:
        """Roller thread: the closed log's records into a segment and the on-disk index; then serve them from
        there and drop the log."""
        with self._lock:
            ids = list(chunk.ids)
            known = {rid: self._index[rid] for rid in ids if rid in self._index}
        keys = write_segment(self.folder, chunk.no, iter_log_rows(self.folder / f"log-{chunk.no:06d}.bin"), known)
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
        if self.on_roll is not None:
            self.on_roll()

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
        if self._evicting and record_id in self._evicting:
            return None
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
        if not missing:
            return found
        with self._segments_rw.shared():  # the index rows and the files they point into, as one view
            by_segment: dict[int, list[tuple[int, str]]] = {}
            for rid, row in self._rolled.get_many(missing).items():
                by_segment.setdefault(row[5], []).append((row[6], rid))
            for no, rows in by_segment.items():
                found.update(read_rows(self.folder / f"seg-{no:06d}.parquet", rows))
        return found

    def scan(self) -> pl.LazyFrame:
        """A consistent LazyFrame over all records (segments plus the unrolled logs, read from disk). Collect it
        soon: a retention round that runs in between may delete or rewrite a segment it names."""
        self.follow()
        with self._read_lock:
            with self._lock:  # a snapshot: segments never change and a log's indexed records only grow
                paths = [p for _, p in sorted(self._segments.items())]
                # an id the index no longer holds is of a deleted scenario (forget): hidden here too
                parts = [(c.fd, [self._index[rid] for rid in c.ids if rid in self._index])
                         for _, c in sorted(self._tail.items()) if c.ids]
            tails = [lines_to_frame([os.pread(fd, e.size, e.pos) for e in entries]) for fd, entries in parts]
        return scan_segments(paths, tails)

    def collect(self, query: Callable[[pl.LazyFrame], pl.LazyFrame]) -> pl.DataFrame:
        """`query(scan())` collected while no retention round swaps or deletes a segment: what a reader outside the
        store uses, since a scan's plan names segment files by path (an episode's report once read a segment being
        rewritten: 'parquet: File out of specification')."""
        with self._segments_rw.shared():
            return query(self.scan()).collect()

    def episode(self, scenario: str, episode: str, caller: str | None, since: float) -> list[str]:
        """The ids of an episode's inference records in turn order ((created_at, id)): a scan of the scenario's
        records (Parquet segments by predicate, the unrolled logs in full): fine for reports and reads, not for the
        per-call path."""
        frame = self.collect(lambda records: records.filter(
            (pl.col("scenario") == scenario) & (pl.col("episode") == episode) & pl.col("caller").eq_missing(caller)
            & (pl.col("kind") == "inference") & (pl.coalesce("stored_at", "created_at") >= since)
        ).select("id", "created_at"))
        return [rid for _, rid in sorted(zip(frame["created_at"].to_list(), frame["id"].to_list(), strict=True))]

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
                    "log_bytes": self._log.size, "broken": self._log.broken, **self.stats}

    def _settle(self) -> bool:
        """Lock held: wait until no commit runs; False when the store is closed already."""
        if self._closed:
            return False
        self._log.settle()
        return True

    def roll_open_log(self, timeout: float = 60) -> None:
        """Close the open log now (if it holds records) and wait until every closed log is in Parquet: for tools
        and tests that want segments; serving never needs it."""
        with self._lock:
            if not self._settle():
                return
            if self._tail[self._log.no].ids:
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
        os.close(self._log.fd)
        for f in self._followed.values():
            os.close(f.fd)
        for c in self._tail.values():
            if c.fd >= 0:
                os.close(c.fd)
        self._rolled.close()


class RelayLog:
    """A relay worker's own record log (server/workers.py): group commit and fdatasync as in RecordStore, and
    nothing else. The primary follows the log (`RecordStore.follow_relays`), indexes and serves its records and
    rolls it into Parquet once the relay has moved on to a new log (or died)."""

    def __init__(self, data_dir: str | Path, roll_records: int = 20_000, roll_bytes: int = 64 << 20):
        self.folder = Path(data_dir) / "records"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.roll_records, self.roll_bytes = roll_records, roll_bytes
        self._lock = threading.Lock()
        self.stats: dict = {}
        self._log = GroupCommitLog(self._lock, self.stats, self._committed, lambda keys: None, places=False)
        self._count, self._closed = 0, False
        self._new_log()

    def _new_log(self) -> None:
        old = self._log.fd
        no, fd = create_log(self.folder)
        self._log.switch(no, fd)
        self._count = 0
        if old >= 0:
            os.close(old)  # frees its lock: the primary reads it to the end and rolls it

    def append(self, records: list[Record]) -> list[bool]:
        """Write records durably (their ids are minted, never client-chosen: each is new)."""
        now = time.time()
        dicts = [{**r.to_dict(), "stored_at": now} for r in records]
        lines = [row_text(d) for d in dicts]
        self._log.append(encode_frame(lines), [(d["id"], d["scenario"], d["kind"], d["content_hash"], now)
                                               for d in dicts], lines)
        return [True] * len(dicts)

    def _committed(self, keys: list[Key], lines: list[bytes], offsets: list[int]) -> None:
        self._count += len(keys)
        if self._count >= self.roll_records or self._log.size >= self.roll_bytes:
            self._new_log()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._log.settle()
            self._closed = True
            os.close(self._log.fd)
