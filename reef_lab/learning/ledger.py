"""The learner's ledger: which records training has consumed and which failed, each with its error, kept in
`learn/<scenario>/state.json` (a shared deployment: its database) across restarts (written atomically, by the learner's thread and by request threads
alike). Consumed: a candidate was made from them, or they were dropped (stale), so a restart replays only the
reports whose learning did not reach a candidate. Failed: a sample the step could not run, or in MAX_TRIES failed
rounds, or a report that could not become a sample (that one is not consumed: a restart tries it again)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable


from reef_lab.files import JsonDoc

FAILED_SHOWN = 20  # status lists the newest this many failed records (state.json keeps them all)


class Ledger:
    def __init__(self, doc: JsonDoc, log_row: Callable[[dict], None]):
        """`doc`: where it is kept (a file, or a shared deployment's database: LearnContext.ledger);
        `log_row`: where each failure is also written (the learner's metrics file and tracker)."""
        self.doc, self._log_row = doc, log_row
        state = doc.read() or {}
        self.consumed: set[str] = set(state.get("consumed", []))
        self.failed: dict[str, dict] = state.get("failed", {})  # record id -> its error, rounds, records, report
        self._lock = threading.Lock()

    def consume(self, record_ids: Iterable[str]) -> None:
        self.consumed.update(record_ids)
        self.save()

    def fail(self, entries: dict[str, dict], consume: Iterable[str] = ()) -> None:
        """Mark records failed, each with its error: kept here, one `failed` row each; `consume`: the record ids
        that leave for good with them (a restart does not replay them)."""
        if not entries:
            return
        at = time.time()
        for rid, entry in entries.items():
            self.failed.pop(rid, None)  # (re-inserted: the newest last)
            self.failed[rid] = {**entry, "at": at}
            self._log_row({"event": "failed", "record": rid, **entry})
        self.consumed.update(consume)
        self.save()

    def recovered(self, record_id: str) -> None:
        """A record that failed to become a sample before and now did: no longer failed."""
        if record_id in self.failed and record_id not in self.consumed:
            del self.failed[record_id]
            self.save()

    def newest_failed(self) -> list[dict]:
        return [{"record": rid, **f} for rid, f in list(self.failed.items())[-FAILED_SHOWN:]]

    def save(self) -> None:
        with self._lock:
            self.doc.write({"consumed": sorted(self.consumed), "failed": self.failed})
