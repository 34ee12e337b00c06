"""A run's heartbeat: how an app tells a run that is alive but quiet from one that died.

Every experiment (scripts/run_experiment.py, or `run_experiment` called in-process; the weight recipes, gepa and
tttd) holds a `Heartbeat` on its run folder for as long as it runs. It writes `heartbeat.json` there:

    {"pid": 4242, "pid_start": 1234567, "boot_id": "...", "host": "...", "pid_ns": "pid:[4026531836]",
     "started_at": ..., "beat_at": ..., "interval_s": 10, "state": "running"}

refreshed every `interval_s` by a background thread, and on exit `state` becomes finished, failed (with the error)
or stopped (interrupted). `pid_start` is the process's start time in clock ticks since boot (/proc/<pid>/stat), so
a pid the kernel has since given to another process is not taken for the run.

`alive(beat)`: where the reader sees the run's process (same host, boot and pid namespace), the process decides:
its pid runs and started at `pid_start`. Elsewhere (a run folder on a shared disk, another container) the beat's age
does: newer than `max(60 s, 6 intervals)`. A run killed with SIGKILL writes nothing more: its pid is gone (or its
beat goes stale), and it reads as stopped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

import orjson

from reef_lab.files import write_atomic

log = logging.getLogger("reef_lab.learning.heartbeat")

FILE = "heartbeat.json"
INTERVAL_S = 10.0
MIN_STALE_S = 60.0  # a beat this old means the run stopped, when its process cannot be looked at


def process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot; None when no such process runs (a zombie, which
    has exited, counts as gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _identity() -> dict:
    """Where this process's pid means something: host, boot and pid namespace."""
    def read(path: str, link: bool = False) -> str | None:
        try:
            return os.readlink(path) if link else Path(path).read_text().strip()
        except OSError:
            return None

    return {"host": socket.gethostname(), "boot_id": read("/proc/sys/kernel/random/boot_id"),
            "pid_ns": read("/proc/self/ns/pid", link=True)}


def read(folder: str | Path) -> dict | None:
    """The heartbeat of the run in `folder`, or None when it has none (a run from before heartbeats, or a folder
    an experiment did not write) or it cannot be parsed (a half-written file is never seen: writes are atomic)."""
    try:
        beat = orjson.loads((Path(folder) / FILE).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return beat if isinstance(beat, dict) and isinstance(beat.get("pid"), int) else None


def alive(beat: dict, now: float | None = None) -> bool:
    """Whether the run that wrote `beat` still runs (see the module docstring)."""
    if beat.get("state") != "running":
        return False
    here = _identity()
    if all(beat.get(k) == here[k] and here[k] is not None for k in ("host", "boot_id", "pid_ns")):
        return process_start(beat["pid"]) == beat.get("pid_start")
    stale = max(MIN_STALE_S, 6 * float(beat.get("interval_s") or INTERVAL_S))
    return (now if now is not None else time.time()) - float(beat.get("beat_at") or 0) < stale


class Heartbeat:
    """`with Heartbeat(run_dir): ...`: `heartbeat.json` in `run_dir`, refreshed every `interval_s` while the block
    runs; its end state written when it leaves (finished, failed with the error, or stopped on an interrupt)."""

    def __init__(self, folder: str | Path, interval_s: float = INTERVAL_S):
        self.path = Path(folder) / FILE
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        pid = os.getpid()
        self.beat = {"pid": pid, "pid_start": process_start(pid), **_identity(), "started_at": time.time(),
                     "beat_at": time.time(), "interval_s": interval_s, "state": "running"}

    def _write(self, **changes) -> None:
        with self._lock:
            self.beat.update(changes, beat_at=time.time())
            try:
                write_atomic(self.path, orjson.dumps(self.beat))
            except OSError as e:  # a full or vanished disk must not kill the run; the app will call it stopped
                log.warning("could not write %s: %s", self.path, e)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()

    def __enter__(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._loop, name="reef-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, error, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if kind is None:
            self._write(state="finished", ended_at=time.time())
        elif issubclass(kind, Exception):
            self._write(state="failed", error=f"{kind.__name__}: {error}"[:2000], ended_at=time.time())
        else:  # KeyboardInterrupt, SystemExit: stopped, not broken
            self._write(state="stopped", error=kind.__name__, ended_at=time.time())
