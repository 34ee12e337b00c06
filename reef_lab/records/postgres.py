"""The record store of a shared deployment: every record in PostgreSQL, committed before its receipt leaves.

Same contract as reef_lab/records/store.py's RecordStore (append, entry, get_many, page, scan, forget), with the
database in place of the data dir's log, so gateways on other machines read a receipt one of them gave, and kill -9
of a gateway's machine (its data dir gone too) loses nothing it acknowledged.

Writes are group-committed: concurrent appenders queue, the first becomes the leader and writes every queued
record with one INSERT (one round trip and one WAL flush for the lot), then wakes the others. A batch of server ids
(80 random bits, never repeated) needs no check; records with client-chosen ids (imports, reports with an id) are
checked against what is stored in the same transaction, and an append whose id exists with other content fails
alone (Conflict), its rows taken out before the commit. When the database is down or the connection breaks, every
append of the batch raises StoreUnavailable (503, Retry-After): nothing of it is acknowledged, whether or not the
commit reached the server before the break (a retried call then makes a second record, never a lost one).

The rows keep the record's row text (records/logfile.py row_text), so a read gives the same dict as the file store,
and Parquet for training and analysis is written from them (`scan`).
Retention's eviction is the file store's (Parquet segments); with PostgreSQL, `--retain-*` is refused at start.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import polars as pl

from reef_lab.errors import Conflict, StoreUnavailable
from reef_lab.records.logfile import parse_row, row_text
from reef_lab.records.record import Record
from reef_lab.records.segments import lines_to_frame
from reef_lab.records.store import IndexEntry

_COLUMNS = "id, scenario, kind, content_hash, stored_at, created_at, episode, caller, row"
_VALUES = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"


def _insert_sql(n: int, notify: bool) -> str:
    """One statement for `n` rows (VALUES, not unnest: a third faster here for the one-row batches of a quiet
    gateway); with `notify`, a notice per new report or demonstration (delivered at commit) for the service that
    learns the scenario, wherever it runs."""
    sql = f"INSERT INTO records ({_COLUMNS}) VALUES {', '.join([_VALUES] * n)} ON CONFLICT (id) DO NOTHING " \
          "RETURNING id, scenario, kind"
    if not notify:
        return sql
    return f"WITH ins AS ({sql}) SELECT id, CASE WHEN kind IN ('report', 'train') THEN pg_notify('reef_changes', " \
           "'report:' || scenario || ':' || id) END FROM ins"


MINE = 4096  # report ids this process wrote lately (its own notices are not handed to its learners twice)


class _Append:
    __slots__ = ("dicts", "lines", "fresh", "error", "done")

    def __init__(self, dicts: list[dict], lines: list[bytes]):
        self.dicts, self.lines = dicts, lines
        self.fresh: list[bool] = []
        self.error: Exception | None = None
        self.done = False


class PgRecordStore:
    """Append-only records in a shared PostgreSQL database (reef_lab.state.postgres.PgState)."""

    epoch = 0  # retention's counter (the file store's): nothing is evicted here

    def __init__(self, state):
        self.state = state
        self.on_roll = None
        self._cv = threading.Condition()
        self._queue: list[_Append] = []
        self._leading = False
        self.stats = {"commits": 0, "commit_errors": 0}
        self._mine: dict[str, None] = {}  # insertion-ordered, bounded (MINE)
        self._writer = None  # the group commit's own connection (the leader's; one leader at a time)

    # ---- writes ------------------------------------------------------------------------------------------------
    def append(self, records: list[Record], refs_checked_at: int | None = None) -> list[bool]:
        """Write records durably (committed in PostgreSQL); per record True (written) or False (the same id and
        content existed). Conflict (nothing written) when an id exists with other content; StoreUnavailable when
        the database cannot take it."""
        dicts = [r.to_dict() for r in records]
        now = time.time()
        seen: set[str] = set()
        for d in dicts:
            d["stored_at"] = now
            if d["id"] in seen:
                raise Conflict(f"record id {d['id']!r} appears twice in one write")
            seen.add(d["id"])
        job = _Append(dicts, [row_text(d) for d in dicts])
        mine = [d["id"] for d in dicts if d["kind"] in ("report", "train")]
        if mine:  # before the commit: its notice may come back before append returns
            with self._cv:
                self._mine.update(dict.fromkeys(mine))
                while len(self._mine) > MINE:
                    self._mine.pop(next(iter(self._mine)))
        with self._cv:
            self._queue.append(job)
            while not job.done:
                if self._leading:
                    self._cv.wait()
                    continue
                self._leading = True
                batch, self._queue = self._queue, []
                self._cv.release()
                try:
                    self._commit(batch)
                finally:
                    self._cv.acquire()
                    self._leading = False
                    self._cv.notify_all()
        if job.error is not None:
            raise job.error
        return job.fresh

    def mine(self, record_id: str) -> bool:
        """Whether this process wrote that report lately (its notice comes back to it too)."""
        return record_id in self._mine

    def _commit(self, batch: list[_Append]) -> None:
        rows = [(d, line) for job in batch for d, line in zip(job.dicts, job.lines, strict=True)]
        chosen = any(d["content_hash"] for d, _ in rows)
        params = [v for d, line in rows for v in (d["id"], d["scenario"], d["kind"], d["content_hash"] or "",
                                                  d["stored_at"], float(d["created_at"] or 0), d.get("episode"),
                                                  d.get("caller"), line)]
        sql = _insert_sql(len(rows), any(d["kind"] in ("report", "train") for d, _ in rows))
        try:
            conn = self._writer if self._writer is not None and not self._writer.closed else None
            if conn is None:
                conn = self._writer = self.state.connect()
            try:
                if not chosen:  # server ids only: one statement, its own transaction
                    inserted = {r[0] for r in conn.execute(sql, params).fetchall()}
                    for job in batch:
                        job.fresh = [d["id"] in inserted for d in job.dicts]
                else:
                    with conn.transaction():
                        self._commit_chosen(conn, batch, sql, params)
            except self.state.lost as e:
                self._writer = None
                conn.close()
                raise self.state.unavailable(e) from None
            self.state.problem = None
            self.stats["commits"] += 1
        except StoreUnavailable as e:
            self.stats["commit_errors"] += 1
            for job in batch:
                job.error = e
        except Exception as e:  # noqa: BLE001 - a bug must not leave appenders waiting: each gets the error
            self.stats["commit_errors"] += 1
            for job in batch:
                job.error = StoreUnavailable(f"the record store failed to write: {type(e).__name__}: {e}")
        finally:
            for job in batch:
                job.done = True

    def _commit_chosen(self, conn, batch: list[_Append], sql: str, params: list) -> None:
        """Inside the batch's transaction: insert, then settle ids that existed before (same content: not fresh;
        other content: that append fails and its rows of this batch are deleted before the commit)."""
        inserted = {r[0] for r in conn.execute(sql, params).fetchall()}
        others = [d["id"] for job in batch for d in job.dicts if d["id"] not in inserted]
        stored = dict(conn.execute("SELECT id, content_hash FROM records WHERE id = ANY(%s)",
                                   (others,)).fetchall()) if others else {}
        claimed: dict[str, str] = {}  # id -> hash, of rows this batch inserted (an id two appends share)
        undo: list[str] = []
        for job in batch:
            fresh, mine = [], []
            for d in job.dicts:
                rid, h = d["id"], d["content_hash"] or ""
                if rid in inserted and rid not in claimed:
                    claimed[rid] = h
                    fresh.append(True)
                    mine.append(rid)
                    continue
                existing = claimed.get(rid, stored.get(rid))
                if existing != h or not h:
                    job.error = Conflict(f"record id {rid!r} already exists with different content")
                    break
                fresh.append(False)
            if job.error is not None:
                undo += mine
                for rid in mine:
                    claimed.pop(rid, None)
            else:
                job.fresh = fresh
        if undo:
            conn.execute("DELETE FROM records WHERE id = ANY(%s)", (undo,))

    # ---- reads -------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        with self.state.connection() as conn:
            return conn.execute("SELECT count(*) FROM records").fetchone()[0]

    def entry(self, record_id: str) -> IndexEntry | None:
        with self.state.connection() as conn:
            row = conn.execute("SELECT scenario, kind, content_hash, stored_at FROM records WHERE id = %s",
                               (record_id,)).fetchone()
        return None if row is None else IndexEntry(row[0], row[1], row[2], row[3], 0)

    def get(self, record_id: str) -> dict | None:
        found = self.get_many([record_id])
        return found[0] if found else None

    def get_many(self, record_ids: list[str]) -> list[dict]:
        if not record_ids:
            return []
        with self.state.connection() as conn:
            rows = dict(conn.execute("SELECT id, row FROM records WHERE id = ANY(%s)", (list(record_ids),)))
        return [parse_row(bytes(rows[rid])) for rid in record_ids if rid in rows]

    def ids(self, scenario: str | None = None, kind: str | None = None, since: float = 0.0) -> list[str]:
        return self.page(scenario, kind, since, None, None)[0]

    def page(self, scenario: str | None, kind: str | None, since: float, after: str | None,
             limit: int | None) -> tuple[list[str], str | None]:
        where, args = ["stored_at >= %s"], [since]
        for col, value in (("scenario", scenario), ("kind", kind)):
            if value is not None:
                where.append(f"{col} = %s")
                args.append(value)
        if after:
            where.append("id > %s")
            args.append(after)
        sql = f"SELECT id FROM records WHERE {' AND '.join(where)} ORDER BY id"
        if limit is not None:
            sql += f" LIMIT {int(limit) + 1}"
        with self.state.connection() as conn:
            out = [r[0] for r in conn.execute(sql, args)]
        if limit is not None and len(out) > limit:
            return out[:limit], out[limit - 1]
        return out, None

    def episode(self, scenario: str, episode: str, caller: str | None, since: float) -> list[str]:
        """The ids of an episode's inference records in turn order ((created_at, id))."""
        with self.state.connection() as conn:
            rows = conn.execute("SELECT id FROM records WHERE scenario = %s AND episode = %s AND kind = 'inference' "
                                "AND caller IS NOT DISTINCT FROM %s AND stored_at >= %s ORDER BY created_at, id",
                                (scenario, episode, caller, since)).fetchall()
        return [r[0] for r in rows]

    def scan(self) -> pl.LazyFrame:
        """Every record as a LazyFrame in the Parquet layout, read from the database now."""
        return self.frame().lazy()

    def frame(self, scenario: str | None = None, since: float = 0.0) -> pl.DataFrame:
        """The records (of one scenario, written since `since`) in the Parquet layout, in write order: what
        export, datasets and analysis read (polars parses the rows' text in Rust, as a log's roll does)."""
        sql, args = "SELECT row FROM records WHERE stored_at >= %s", [since]
        if scenario is not None:
            sql, args = sql + " AND scenario = %s", [since, scenario]
        with self.state.connection() as conn:
            lines = [bytes(r[0]) for r in conn.execute(sql + " ORDER BY seq", args)]
        return lines_to_frame(lines)

    def collect(self, query: Callable[[pl.LazyFrame], pl.LazyFrame]) -> pl.DataFrame:
        return query(self.scan()).collect()

    def forget(self, scenario: str) -> int:
        """A deleted scenario's records: kept (append-only), hidden by the scenario's `since` as in the file store;
        the count of what is hidden."""
        with self.state.connection() as conn:
            return conn.execute("SELECT count(*) FROM records WHERE scenario = %s", (scenario,)).fetchone()[0]

    def info(self) -> dict:
        try:
            n = len(self)
        except StoreUnavailable as e:
            return {"records": None, "backend": "postgresql", "broken": e.message, **self.stats}
        return {"records": n, "backend": "postgresql", "broken": None, **self.stats}

    def follow_relays(self) -> None:
        """Relays of this machine write to the database themselves: nothing to follow."""

    def roll_open_log(self, timeout: float = 60) -> None:
        """Nothing is waiting in a log: every record is in the database once appended."""

    def close(self) -> None:
        """The database stays; the state's pool is closed by its owner, the writer's connection here."""
        if self._writer is not None:
            self._writer.close()
