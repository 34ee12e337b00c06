"""The index of records already rolled into Parquet segments: id -> scenario, kind, hash, write time, segment, row.

Why on disk: an index held in memory grows by a few hundred bytes per record for the life of the process, and
reading a record by id from a segment without knowing its row meant scanning the segment. This index is a SQLite
file (`records/index.sqlite`, stdlib `sqlite3`), written only by the roller thread, one transaction per segment,
so the request path never waits on it; records not yet rolled are indexed in memory by the store.

`segment_parts` holds, per segment and scenario, how many rows the segment file holds and their oldest and newest
write time: what retention (reef_lab/records/retention.py) plans with, without reading the records table.

It is derived data: every row can be rebuilt from the segments themselves. `segments` lists the segments whose rows
are in; at open the store adds any segment missing from it (a crash between a segment's rename and its index
commit, a data dir written before the index existed) and drops rows of segments that are gone. A file SQLite cannot
open is deleted and rebuilt. WAL with synchronous=NORMAL: a power cut may lose the last commits, never corrupts.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("reef_lab.records.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY, scenario TEXT NOT NULL, kind TEXT NOT NULL, content_hash TEXT NOT NULL,
    stored_at REAL NOT NULL, segment INTEGER NOT NULL, row INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_by_scenario ON records (scenario, id);
CREATE INDEX IF NOT EXISTS records_by_kind ON records (scenario, kind, id);
CREATE TABLE IF NOT EXISTS segments (no INTEGER PRIMARY KEY, rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS segment_parts (
    no INTEGER NOT NULL, scenario TEXT NOT NULL, rows INTEGER NOT NULL, oldest REAL NOT NULL, newest REAL NOT NULL,
    PRIMARY KEY (no, scenario)) WITHOUT ROWID;
"""

Row = tuple[str, str, str, str, float, int, int]  # id, scenario, kind, content_hash, stored_at, segment, row
CACHED = 16_384  # rows kept in memory, most recently asked first (~3 MB): a report names recent receipts again and
# again, and a query of this file costs far more than a dict lookup (results/log/gateway-notes.md)


class SegmentIndex:
    """Rolled records by id, and per scenario in id order. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, Row] = OrderedDict()
        try:
            self._db = self._connect()
        except sqlite3.DatabaseError as e:
            log.warning("record index %s cannot be read (%s); rebuilding it from the segments", path, e)
            for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                p.unlink(missing_ok=True)
            self._db = self._connect()
        self.count = self._db.execute("SELECT count(*) FROM records").fetchone()[0]
        missing = [no for (no,) in self._db.execute(
            "SELECT no FROM segments WHERE no NOT IN (SELECT DISTINCT no FROM segment_parts)")]
        if missing:  # an index written before segment_parts existed: fill it once from the records
            self._db.execute(f"INSERT OR IGNORE INTO segment_parts SELECT segment, scenario, count(*), "
                             f"min(stored_at), max(stored_at) FROM records WHERE segment IN "
                             f"({','.join(map(str, missing))}) GROUP BY segment, scenario")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        db.execute("SELECT count(*) FROM segments").fetchone()  # a damaged file fails here, not later
        return db

    def segments(self) -> set[int]:
        with self._lock:
            return {no for (no,) in self._db.execute("SELECT no FROM segments")}

    def add_segment(self, no: int, rows: list[Row], reindex: bool = False) -> None:
        """Index one segment's records in one transaction (after the segment is durable). `reindex` (at start, for
        a segment the index may half know) first drops any rows it holds of it: a scan of the table, so a roll
        does not ask for it."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                gone = 0
                if reindex:
                    self._cache.clear()
                    gone = self._db.execute("DELETE FROM records WHERE segment = ?", (no,)).rowcount
                self._db.executemany("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
                self._db.execute("INSERT OR REPLACE INTO segments VALUES (?, ?)", (no, len(rows)))
                self._set_parts(no, [(r[1], r[4]) for r in rows])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.count += len(rows) - gone

    def _set_parts(self, no: int, rows: list[tuple[str, float]]) -> None:
        """Lock held, in a transaction: segment `no`'s parts from its rows' (scenario, stored_at)."""
        parts: dict[str, list] = {}
        for scenario, at in rows:
            p = parts.get(scenario)
            if p is None:
                parts[scenario] = [1, at, at]
            else:
                p[0] += 1
                p[1], p[2] = min(p[1], at), max(p[2], at)
        self._db.execute("DELETE FROM segment_parts WHERE no = ?", (no,))
        self._db.executemany("INSERT INTO segment_parts VALUES (?, ?, ?, ?, ?)",
                             [(no, sc, *p) for sc, p in parts.items()])

    def drop_segments(self, nos: set[int]) -> None:
        with self._lock:
            self._cache.clear()
            for no in nos:
                self.count -= self._db.execute("DELETE FROM records WHERE segment = ?", (no,)).rowcount
                self._db.execute("DELETE FROM segments WHERE no = ?", (no,))
                self._db.execute("DELETE FROM segment_parts WHERE no = ?", (no,))

    def parts(self) -> dict[int, list[tuple[str, int, float, float]]]:
        """Per segment: (scenario, rows, oldest, newest) of each scenario it holds."""
        out: dict[int, list] = {}
        with self._lock:
            for no, sc, rows, oldest, newest in self._db.execute("SELECT * FROM segment_parts ORDER BY no"):
                out.setdefault(no, []).append((sc, rows, oldest, newest))
        return out

    def evict(self, no: int, gone: list[str], kept: list[tuple[str, str, float]]) -> None:
        """One transaction: segment `no` lost the records `gone`; `kept` are (id, scenario, stored_at) of the rows
        it holds now, in row order (none: the segment is deleted)."""
        with self._lock:
            self._cache.clear()
            self._db.execute("BEGIN")
            try:
                n = 0
                for i in range(0, len(gone), 500):
                    part = gone[i:i + 500]
                    n += self._db.execute(f"DELETE FROM records WHERE id IN ({','.join('?' * len(part))})",
                                          part).rowcount
                if kept:
                    self._db.executemany("UPDATE records SET row = ? WHERE id = ?",
                                         [(row, rid) for row, (rid, _, _) in enumerate(kept)])
                    self._db.execute("INSERT OR REPLACE INTO segments VALUES (?, ?)", (no, len(kept)))
                    self._set_parts(no, [(sc, at) for _, sc, at in kept])
                else:
                    self._db.execute("DELETE FROM segments WHERE no = ?", (no,))
                    self._db.execute("DELETE FROM segment_parts WHERE no = ?", (no,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.count -= n

    def get(self, record_id: str) -> Row | None:
        with self._lock:
            row = self._cache.get(record_id)
            if row is not None:
                self._cache.move_to_end(record_id)
                return row
            row = self._db.execute("SELECT * FROM records WHERE id = ?", (record_id,)).fetchone()
            if row is not None:
                self._cache[record_id] = row
                if len(self._cache) > CACHED:
                    self._cache.popitem(last=False)
            return row

    def get_many(self, ids: list[str]) -> dict[str, Row]:
        out: dict[str, Row] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                part = ids[i:i + 500]
                q = f"SELECT * FROM records WHERE id IN ({','.join('?' * len(part))})"
                out.update((r[0], r) for r in self._db.execute(q, part))
        return out

    def page(self, scenario: str | None, kind: str | None, since: float, after: str | None,
             limit: int | None) -> list[str]:
        """Ids in id order after `after`, of one scenario (or all) and kind, written at or after `since`."""
        where, args = ["stored_at >= ?"], [since]
        if scenario is not None:
            where.append("scenario = ?")
            args.append(scenario)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if after is not None:
            where.append("id > ?")
            args.append(after)
        q = f"SELECT id FROM records WHERE {' AND '.join(where)} ORDER BY id"
        if limit is not None:
            q += f" LIMIT {int(limit)}"
        with self._lock:
            return [r[0] for r in self._db.execute(q, args)]

    def forget(self, scenario: str) -> int:
        with self._lock:
            self._cache.clear()
            n = self._db.execute("DELETE FROM records WHERE scenario = ?", (scenario,)).rowcount
            self.count -= n
        return n

    def close(self) -> None:
        with self._lock:
            self._db.close()
