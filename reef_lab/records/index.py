"""The index of records already rolled into Parquet segments: id -> scenario, kind, hash, write time, segment, row.

Why on disk: an index held in memory grows by a few hundred bytes per record for the life of the process, and
reading a record by id from a segment without knowing its row meant scanning the segment. This index is a SQLite
file (`records/index.sqlite`, stdlib `sqlite3`), written only by the roller thread, one transaction per segment,
so the request path never waits on it; records not yet rolled are indexed in memory by the store.

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
"""

Row = tuple[str, str, str, str, float, int, int]  # id, scenario, kind, content_hash, stored_at, segment, row
CACHED = 16_384  # rows kept in memory, most recently asked first (~3 MB): a report names recent receipts again and
# again, and a query of this file costs far more than a dict lookup (results/gateway-notes.md)


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
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self.count += len(rows) - gone

    def drop_segments(self, nos: set[int]) -> None:
        with self._lock:
            self._cache.clear()
            for no in nos:
                self.count -= self._db.execute("DELETE FROM records WHERE segment = ?", (no,)).rowcount
                self._db.execute("DELETE FROM segments WHERE no = ?", (no,))

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
