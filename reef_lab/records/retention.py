"""Retention: which rolled records a data dir keeps, and the background thread that evicts the others.

Records are append-only, so without a policy they grow until the disk is full. The operator sets limits for the
data dir (`--retain-max-bytes`, `--retain-max-age`, `--retain-max-records`) and may add tighter ones for single
scenarios (`--retain-scenarios`); clients set nothing. Eviction works on rolled Parquet segments only (a record
still in a log waits for its roll) and in segment-sized units, oldest first:

- The data dir's limits drop whole segments: one older than `max_age` (its newest record is), and one whose newest
  record has at least `max_bytes`/`max_records` of records after it. So no record among the newest `max_records`,
  the newest `max_bytes` or younger than `max_age` is ever evicted, and after a round the store exceeds a size
  limit by less than what straddles the boundary in time: one segment or open log per process writing logs (plus
  the records kept because they are pinned).
- A scenario's limits drop that scenario's part of a segment by the same rules, counted over its own records.
- Pinned records stay whatever the limits say: those a learner still needs and those a release's lineage names
  (the Gateway says which; see docs/records.md). A segment whose records all go is deleted; one that keeps some
  is rewritten without the others (reef_lab/records/eviction.py, `evict`).

`plan` is the pure decision (unit-tested on its own); `Retainer` runs it after every roll and on a timer.
"""

from __future__ import annotations

import bisect
import fnmatch
import logging
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

log = logging.getLogger("reef_lab.records.retention")

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SECONDS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")
LIMITS = ("max_bytes", "max_age", "max_records")


def parse_bytes(value, name: str = "max_bytes") -> int:
    """A size: bytes as a number, or with a unit (KB, MB, GB, TB; powers of 1024), e.g. '20GB'."""
    m = _AMOUNT.match(str(value)) if not isinstance(value, bool) else None
    if m is None or m[2].lower() not in _UNITS:
        raise ValueError(f"{name} must be a size such as 500MB or 20GB (units B, KB, MB, GB, TB), got {value!r}")
    n = int(float(m[1]) * _UNITS[m[2].lower()])
    if n <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return n


def parse_duration(value, name: str = "max_age") -> float:
    """A duration: seconds as a number, or with a unit (s, m, h, d, w), e.g. '30d' or '12h'."""
    m = _AMOUNT.match(str(value)) if not isinstance(value, bool) else None
    if m is None or m[2].lower() not in _SECONDS:
        raise ValueError(f"{name} must be a duration such as 90s, 30m, 12h or 30d, got {value!r}")
    s = float(m[1]) * _SECONDS[m[2].lower()]
    if s <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return s


@dataclass(frozen=True)
class RetentionPolicy:
    """Limits on a set of records (None: no limit of that kind)."""

    max_bytes: int | None = None
    max_age: float | None = None  # seconds since the record was stored
    max_records: int | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.max_bytes, self.max_age, self.max_records))

    @classmethod
    def parse(cls, max_bytes=None, max_age=None, max_records=None, where: str = "") -> RetentionPolicy:
        def name(k):
            return f"{where}{k}"
        if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int)
                                        or max_records < 1):
            raise ValueError(f"{name('max_records')} must be a whole number of records, at least 1, "
                             f"got {max_records!r}")
        return cls(None if max_bytes is None else parse_bytes(max_bytes, name("max_bytes")),
                   None if max_age is None else parse_duration(max_age, name("max_age")), max_records)


@dataclass
class RetentionConfig:
    """The operator's retention: limits for the whole data dir and tighter ones per scenario (exact names first,
    then `fnmatch` patterns in the order given). A scenario's limits apply on top of the data dir's: they can only
    make its records go sooner, never keep them longer than the data dir allows."""

    data_dir: RetentionPolicy = field(default_factory=RetentionPolicy)
    scenarios: dict[str, RetentionPolicy] = field(default_factory=dict)
    interval: float = 60.0  # seconds between rounds when no roll wakes the thread

    @classmethod
    def from_mapping(cls, data_dir: RetentionPolicy, scenarios: dict | None, interval: float = 60.0):
        out = {}
        for key, limits in (scenarios or {}).items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"retain_scenarios: keys are scenario names or patterns, got {key!r}")
            if not isinstance(limits, dict) or not limits:
                raise ValueError(f"retain_scenarios[{key!r}] must be a mapping of limits "
                                 f"({', '.join(LIMITS)}), e.g. {{max_age: 7d}}")
            unknown = set(limits) - set(LIMITS)
            if unknown:
                raise ValueError(f"retain_scenarios[{key!r}]: unknown limit(s) {sorted(unknown)}; "
                                 f"known: {list(LIMITS)}")
            out[key] = RetentionPolicy.parse(**limits, where=f"retain_scenarios[{key!r}].")
        return cls(data_dir, out, interval)

    @property
    def active(self) -> bool:
        return self.data_dir.active or any(p.active for p in self.scenarios.values())

    def policy_for(self, scenario: str) -> RetentionPolicy | None:
        if scenario in self.scenarios:
            return self.scenarios[scenario]
        return next((p for pat, p in self.scenarios.items() if fnmatch.fnmatchcase(scenario, pat)), None)

    def describe(self) -> dict:
        return {"data_dir": asdict(self.data_dir), "scenarios": {k: asdict(v) for k, v in self.scenarios.items()},
                "interval_s": self.interval}


# ---- the decision ------------------------------------------------------------------------------------------------
@dataclass
class Part:
    """One scenario's records in one segment."""

    rows: int
    oldest: float
    newest: float


@dataclass
class SegmentStat:
    no: int
    bytes: int
    parts: dict[str, Part]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.parts.values())

    @property
    def oldest(self) -> float:
        return min((p.oldest for p in self.parts.values()), default=0.0)

    @property
    def newest(self) -> float:
        return max((p.newest for p in self.parts.values()), default=0.0)


@dataclass
class Piece:
    """What one decision is about: a segment, or one scenario's part of it."""

    rows: int
    bytes: float
    oldest: float
    newest: float


def due(pieces: list[Piece], tail: list[tuple[float, float]], policy: RetentionPolicy, now: float) -> set[int]:
    """Which pieces (by index) `policy` evicts. `tail`: (write time, bytes) of the records in logs, sorted, which
    count but are never evicted. A piece goes when its newest record is older than max_age, or when the records
    known to be newer than its newest one (pieces that begin after it ends, and log records) hold max_bytes /
    max_records on their own: so no record among the newest max_records / max_bytes goes, even where pieces
    overlap in time (several workers write logs at once)."""
    out: set[int] = set()
    starts = sorted(range(len(pieces)), key=lambda i: pieces[i].oldest)
    oldest = [pieces[i].oldest for i in starts]
    rows_after, bytes_after = [0] * (len(starts) + 1), [0.0] * (len(starts) + 1)
    for k in range(len(starts) - 1, -1, -1):
        rows_after[k] = rows_after[k + 1] + pieces[starts[k]].rows
        bytes_after[k] = bytes_after[k + 1] + pieces[starts[k]].bytes
    tail_times = [t for t, _ in tail]
    tail_after = [0.0] * (len(tail) + 1)
    for k in range(len(tail) - 1, -1, -1):
        tail_after[k] = tail_after[k + 1] + tail[k][1]
    capped = policy.max_bytes is not None or policy.max_records is not None
    for i in sorted(range(len(pieces)), key=lambda i: (pieces[i].newest, i)):
        t = pieces[i].newest
        if policy.max_age is not None and t < now - policy.max_age:
            out.add(i)
            continue
        if not capped:
            continue
        k, j = bisect.bisect_right(oldest, t), bisect.bisect_right(tail_times, t)
        newer_rows, newer_bytes = rows_after[k] + len(tail) - j, bytes_after[k] + tail_after[j]
        if ((policy.max_bytes is not None and newer_bytes >= policy.max_bytes)
                or (policy.max_records is not None and newer_rows >= policy.max_records)):
            out.add(i)
        else:
            capped = False  # a newer piece has fewer records after it: none of them goes for size either
    return out


def plan(segments: list[SegmentStat], tail: dict[str, list[tuple[float, float]]], config: RetentionConfig,
         now: float) -> dict[int, set[str] | None]:
    """What goes: segment number -> the scenarios whose records in it go (None: the whole segment).

    `tail`: per scenario, (write time, bytes on disk) of its records in logs not rolled yet, sorted. A scenario's
    bytes in a segment are its share of the segment's rows. Pins are not known here: a pinned record counts as
    gone, so it never makes a younger record go in its place."""
    out: dict[int, set[str] | None] = {}
    if config.data_dir.active:
        pieces = [Piece(s.rows, s.bytes, s.oldest, s.newest) for s in segments]
        every = sorted(x for records in tail.values() for x in records)
        for i in due(pieces, every, config.data_dir, now):
            out[segments[i].no] = None
    by_scenario: dict[str, list[tuple[int, Piece]]] = {}
    for s in segments:
        if s.no not in out:  # a segment the data dir's limits take is gone for every scenario's count too
            for name, part in s.parts.items():
                by_scenario.setdefault(name, []).append(
                    (s.no, Piece(part.rows, s.bytes * part.rows / max(s.rows, 1), part.oldest, part.newest)))
    for name, parts in by_scenario.items():
        policy = config.policy_for(name)
        if policy is not None and policy.active:
            for i in due([p for _, p in parts], tail.get(name, []), policy, now):
                out.setdefault(parts[i][0], set()).add(name)
    for s in segments:  # every scenario of a segment goes: the whole segment goes
        names = out.get(s.no)
        if names is not None and names >= set(s.parts):
            out[s.no] = None
    return out


# ---- the thread --------------------------------------------------------------------------------------------------
class Retainer:
    """Runs retention rounds on its own thread: after every roll (the store calls `wake`) and every `interval`
    seconds. `pins()` returns the ids that must stay (records learners still need, records of release lineage);
    it is asked after the round's candidates are fenced (see RecordStore.fence), so a report stored meanwhile that
    references a candidate keeps it too."""

    def __init__(self, store, config: RetentionConfig, pins: Callable[[], set[str]],
                 clock: Callable[[], float] = time.time):
        self.store, self.config, self.pins, self.clock = store, config, pins, clock
        self.evicted = {"segments": 0, "rewritten": 0, "records": 0, "bytes": 0}
        self.by_scenario: dict[str, dict[str, int]] = {}
        self.rounds, self.last_round, self.last_error = 0, None, None
        self.cpu_s = 0.0  # CPU time the rounds took, in the threads that ran them
        self._lock = threading.Lock()  # one round at a time (the thread's, or a caller's `run_round`)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reef-retention", daemon=True)

    def start(self) -> Retainer:
        self._thread.start()
        return self

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_round()
                self.last_error = None
            except Exception as e:  # noqa: BLE001 - logged and shown in /reef/status; the next round retries
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("retention round failed; the next one retries")

    def _min_age(self) -> float | None:
        ages = [p.max_age for p in (self.config.data_dir, *self.config.scenarios.values()) if p.max_age]
        return min(ages) if ages else None

    def run_round(self) -> dict:
        """One round: plan, fence, pin, evict segment by segment. Returns what it did."""
        with self._lock:
            started, cpu = time.monotonic(), time.thread_time()
            now = self.clock()
            min_age = self._min_age()
            if min_age is not None:  # a slow log would keep its records past max_age: roll it once they are due
                self.store.rotate_if_older(now - min_age)
            stats, tail = self.store.retention_stats()
            drops = plan(stats, tail, self.config, now)
            done = {"segments": 0, "rewritten": 0, "records": 0, "bytes": 0, "pinned": 0, "skipped": 0}
            if drops:
                candidates = self.store.eviction_candidates(drops)
                self.store.fence({rid for ids in candidates.values() for rid in ids})
                try:
                    pinned = self.pins()
                    for no, ids in sorted(candidates.items()):
                        keep = ids.keys() & pinned
                        done["pinned"] += len(keep)
                        drop = {rid: sc for rid, sc in ids.items() if rid not in keep}
                        if not drop:
                            continue
                        result = self.store.evict(no, drop)
                        if result is None:  # a report referenced one of them meanwhile: the next round decides
                            done["skipped"] += 1
                            continue
                        self._count(no, result, done)
                finally:
                    self.store.unfence()
            self.rounds += 1
            self.cpu_s += time.thread_time() - cpu
            self.last_round = {"at": now, "seconds": round(time.monotonic() - started, 3), **done}
            return self.last_round

    def _count(self, no: int, result: dict, done: dict) -> None:
        kind = "segments" if result["deleted"] else "rewritten"
        for target in (self.evicted, done):
            target[kind] += 1
            target["records"] += result["records"]
            target["bytes"] += result["bytes"]
        for name, n in result["by_scenario"].items():
            c = self.by_scenario.setdefault(name, {"segments": 0, "records": 0, "bytes": 0})
            c["segments"] += 1
            c["records"] += n
            c["bytes"] += round(result["bytes"] * n / max(result["records"], 1))
        log.info("retention: segment %06d %s: %d records evicted (%s), %d bytes freed, %d records kept",
                 no, "deleted" if result["deleted"] else "rewritten", result["records"],
                 ", ".join(f"{k}: {v}" for k, v in sorted(result["by_scenario"].items())), result["bytes"],
                 result["kept"])

    def status(self) -> dict:
        return {"policy": self.config.describe(), "evicted": dict(self.evicted),
                "by_scenario": {k: dict(v) for k, v in self.by_scenario.items()}, "rounds": self.rounds,
                "cpu_s": round(self.cpu_s, 3),
                "last_round": self.last_round, "last_error": self.last_error}

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(120)
