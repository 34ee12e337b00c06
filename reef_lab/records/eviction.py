"""The store's eviction half: what retention (reef_lab/records/retention.py) asks of a RecordStore.

A mixin of reef_lab.records.store.RecordStore, kept apart so the store's file stays about writing, rolling and
reading. It reads the store's state (`_lock`, `_segments`, `_rolled`, `_tail`, ...) under the store's own locks.
Eviction deletes a segment whose records all go and rewrites one that keeps some, in steps that a crash between any
two leaves recoverable (`_evict_steps`).
"""

from __future__ import annotations

import contextlib
import os
import threading

import polars as pl

from reef_lab.records.logfile import _fsync_dir
from reef_lab.records.retention import Part, SegmentStat
from reef_lab.records.segments import rewrite_segment, segment_ids


class SharedLock:
    """Many holders or one: reads of segments share it; retention's swap of a segment (file and index) holds it
    alone, so a read never pairs an index row with a file that no longer matches it."""

    def __init__(self):
        self._cv = threading.Condition()
        self._readers, self._writer, self._waiting = 0, False, 0

    @contextlib.contextmanager
    def shared(self):
        with self._cv:
            while self._writer or self._waiting:
                self._cv.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cv:
                self._readers -= 1
                if not self._readers:
                    self._cv.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cv:
            self._waiting += 1
            while self._writer or self._readers:
                self._cv.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cv:
                self._writer = False
                self._cv.notify_all()


class SegmentEviction:
    """Retention's operations on a RecordStore (mixed into it)."""

    def retention_stats(self) -> tuple[list[SegmentStat], dict[str, list[tuple[float, float]]]]:
        """What retention plans with: each segment's size and per-scenario rows and write times (from the index);
        per scenario (write time, bytes) of each record in logs, never evicted but counted (its row's share of the
        logs' size on disk, which includes what a log wrote ahead). Read in that order, so a roll in between hides
        records from both (fewer go), never counts them twice; a segment the index has no parts of yet is left
        out."""
        parts = self._rolled.parts()
        with self._lock:
            segments = [(no, path) for no, path in sorted(self._segments.items()) if no in parts]
            ids = [list(v) for v in self._scenario_ids.values() if v]
            on_disk = {self._log.no: os.fstat(self._log.fd).st_size}  # with what it wrote ahead, as du counts
        stats = []
        for no, path in segments:
            with contextlib.suppress(FileNotFoundError):
                stats.append(SegmentStat(no, path.stat().st_size, {sc: Part(n, lo, hi) for sc, n, lo, hi in parts[no]}))
        rows = []
        for lst in ids:
            for rid in lst:
                e = self._index.get(rid)  # without the lock: one rolled meanwhile is gone (and not counted)
                if e is not None and e.chunk >= 0:
                    rows.append((e.scenario, e.stored_at, e.chunk, e.size))
        text: dict[int, int] = {}
        for _, _, no, size in rows:
            text[no] = text.get(no, 0) + size
        for no in text.keys() - on_disk.keys():
            try:
                on_disk[no] = (self.folder / f"log-{no:06d}.bin").stat().st_size
            except FileNotFoundError:  # rolled meanwhile
                on_disk[no] = 0
        tail: dict[str, list[tuple[float, float]]] = {}
        for scenario, at, no, size in rows:
            tail.setdefault(scenario, []).append((at, on_disk.get(no, 0) * size / max(text[no], 1)))
        for records in tail.values():
            records.sort()
        return stats, tail

    def rotate_if_older(self, before: float) -> bool:
        """Close the open log (it rolls soon) if its oldest record was written before `before`: a log that fills
        slowly would otherwise keep records past an age limit."""
        with self._lock:
            if not self._settle():
                return False
            ids = self._tail[self._log.no].ids
            e = self._index.get(ids[0]) if ids else None
            if e is None or e.stored_at >= before:
                return False
            self._rotate()
            return True

    def eviction_candidates(self, drops: dict[int, set[str] | None]) -> dict[int, dict[str, str]]:
        """The records a plan names (id -> scenario), read from each segment: the rows of the scenarios that go,
        or all of them (None)."""
        out = {}
        for no, names in sorted(drops.items()):
            path = self._segments.get(no)
            if path is not None:
                out[no] = {rid: sc for rid, sc in segment_ids(path) if names is None or sc in names}
        return out

    def reports_and_references(self, scenarios: list[str]) -> set[str]:
        """Ids of the reports and train records of these scenarios and of every record they reference."""
        df = self.scan().filter(pl.col("scenario").is_in(scenarios) & pl.col("kind").is_in(["report", "train"])) \
            .select("id", "references").collect()
        out = set(df["id"].to_list())
        for refs in df["references"].to_list():
            out.update(refs or ())
        return out

    def fence(self, ids: set[str]) -> None:
        """A round may evict these ids: from now an append that references one takes it out (it stays)."""
        with self._lock:
            self._fence = set(ids)

    def unfence(self) -> None:
        with self._lock:
            self._fence = set()

    def evict(self, no: int, drop: dict[str, str]) -> dict | None:
        """Evict records (id -> scenario) of segment `no`: the whole file when they are all it holds, else a
        rewrite without them. None (nothing done) when an append referenced one of them since `fence`."""
        steps = self._evict_steps(no, drop)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def _evict_steps(self, no: int, drop: dict[str, str]):
        """`evict` one step per `next`. Each step leaves a state that opening the store recovers from:
        written (a .tmp file, deleted at open) -> marked (`rewrite-N`: at open, N is re-indexed from its file)
        -> replaced (the new file in place) or unlinked (the segment gone; its index rows are dropped at open)
        -> indexed (the index matches the file; the marker's re-index finds nothing to change) -> marker removed.
        So no crash loses a record that stays, and none leaves an index row pointing into a deleted segment."""
        path = self.folder / f"seg-{no:06d}.parquet"
        size = path.stat().st_size
        rows = segment_ids(path)
        whole = len(drop) == len(rows)
        tmp, kept = (None, []) if whole else rewrite_segment(path, set(drop))
        yield "written"
        with self._lock:
            if not drop.keys() <= self._fence:  # referenced since the round began: the next round decides
                if tmp is not None:
                    tmp.unlink()
                return None
            self.epoch += 1
            self._evicting = set(drop)
        marker = self.folder / f"rewrite-{no:06d}"
        try:
            if not whole:
                marker.touch()
                _fsync_dir(self.folder)
                yield "marked"
            with self._segments_rw.exclusive():
                if whole:
                    path.unlink()
                    _fsync_dir(self.folder)
                    yield "unlinked"
                    with self._lock:
                        self._segments.pop(no, None)
                else:
                    os.replace(tmp, path)
                    _fsync_dir(self.folder)
                    yield "replaced"
                try:
                    self._rolled.evict(no, list(drop), kept)
                except Exception:  # the file has changed: bring the index in line with it, as opening would
                    if whole:
                        self._rolled.drop_segments({no})
                    else:
                        self._index_segment(no)
                    raise
            yield "indexed"
            if not whole:
                marker.unlink()
                _fsync_dir(self.folder)
        finally:
            with self._lock:
                self._evicting = set()
        by_scenario: dict[str, int] = {}
        for sc in drop.values():
            by_scenario[sc] = by_scenario.get(sc, 0) + 1
        return {"deleted": whole, "records": len(drop), "kept": len(kept), "by_scenario": by_scenario,
                "bytes": size - (0 if whole else path.stat().st_size)}
