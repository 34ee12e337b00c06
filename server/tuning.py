"""Server tuning for several workers on few CPUs: each worker pinned to a CPU of its own (`--pin-workers`, on by
default), and a short scheduler time slice for its threads while the machine has idle CPU (SliceGovernor,
`--sched-slice-us 100`, opt-in). scripts/bench/bench_tuning.py measures both against plain settings side by side;
results/server-tuning.md holds what it found and why pinning is a default and the slice is not.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import struct
import threading
import time
from pathlib import Path
from typing import Callable

log = logging.getLogger("reef_lab.server")


def apply(cfg, held: list):
    """The tuning a ServeConfig asks for, in this worker process, before it starts any thread (they inherit it):
    its CPU slot (kept open in `held` for the process's life) and the slice governor, which it returns (or None)."""
    import sys

    if not sys.platform.startswith("linux"):
        return None
    governor = SliceGovernor(cfg.sched_slice_us, cfg.sched_slice_busy) \
        if cfg.upstream_url and cfg.sched_slice_us else None
    if cfg.worker_count() > 1 and cfg.pin_workers:
        slot = pin_worker(cfg.data_dir, cfg.worker_count())
        if slot is not None:  # None: every slot taken (a respawned worker before its old one died), left unpinned
            held.append(slot)
    return governor


def pin_worker(data_dir: str | Path, workers: int):
    """Pin this worker (all its threads, and those it starts later) to a CPU of its own; returns the slot lock.

    Why: a request crosses several threads of one worker (granian's runtime, a WSGI thread, the record commit);
    when they share a CPU a wakeup is a run-queue insert, not an interrupt to another (virtual) CPU; pinned
    workers serve more requests/s (results/log/gateway-notes.md). The slot (0..workers-1) is the first free `<data dir>/.worker-<k>.lock`.
    """
    cpus = sorted(os.sched_getaffinity(0))
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    for k in range(workers):
        f = open(Path(data_dir) / f".worker-{k}.lock", "a+b")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        cpu = cpus[k % len(cpus)]
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), {cpu})
            except OSError:  # a thread that just ended
                pass
        log.info("worker %d pinned to CPU %d", os.getpid(), cpu)
        return f
    return None


_SCHED_ATTR = struct.Struct("<IIQiIQQQII")  # struct sched_attr (56 bytes); sched_runtime is the 6th field
_SCHED_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # sched_setattr, sched_getattr


def ask_short_slice(us: int) -> int:
    """Ask the scheduler for a `us`-microsecond time slice for every thread of this process (and, inherited, those
    it starts later; 0: the kernel's default again); returns how many threads took it.

    Why: on a 2-CPU machine a request's thread sleeps twice (the provider's answer, the record's flush) and must then
    win a CPU back from the load generator, the stub or the other worker. Linux's EEVDF scheduler (6.12+) lets a
    thread of the normal class ask for a shorter slice, which gives it an earlier deadline when it wakes, so it runs
    sooner: a trimmed latency tail, the median within noise (scripts/bench/bench_gateway.py measures it beside the
    kernel's default; the A/B runs are in results/log/gateway-notes.md). Older kernels ignore the field. SliceGovernor decides when to ask.
    """
    calls = _SCHED_SYSCALLS.get(os.uname().machine)
    if calls is None:
        return 0
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    attr = ctypes.create_string_buffer(_SCHED_ATTR.pack(_SCHED_ATTR.size, 0, 0, 0, 0, us * 1000, 0, 0, 0, 0))
    return sum(syscall(calls[0], int(tid), attr, 0) == 0 for tid in os.listdir("/proc/self/task"))


def cpu_ticks() -> list[int]:
    """The machine's CPU time counters so far (/proc/stat's first line: user, nice, system, idle, iowait, irq,
    softirq, steal), or [] where there is none."""
    try:
        with open("/proc/stat", "rb") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return []


def machine_busy(prev: list[int] | None = None) -> tuple[float | None, list[int]]:
    """The share of all CPUs' time spent busy (steal included: time the host did not give us) since `prev`, and
    the counters to pass next time; None on the first call or where /proc/stat is missing."""
    ticks = cpu_ticks()
    if not prev or not ticks:
        return None, ticks
    d = [a - b for a, b in zip(ticks, prev)]
    total = sum(d)
    return (1 - (d[3] + d[4]) / total if total > 0 else None), ticks  # fields 3, 4: idle, iowait


class MachineLoad:
    """The machine's busy share since the previous call (machine_busy with its counters kept)."""

    def __init__(self) -> None:
        _, self.prev = machine_busy()

    def __call__(self) -> float | None:
        share, self.prev = machine_busy(self.prev)
        return share


class SliceGovernor:
    """Keeps this worker's threads on the short slice while the machine has idle CPU, on the kernel's default while
    it is saturated (busy above `busy`, back once below `busy - 0.15`), checked every `period` seconds.

    Why: the short slice buys latency by letting a woken thread preempt sooner; that only pays while a CPU is
    free to run it. Saturated, every thread is runnable and the short slice only multiplies preemptions: the
    kernel's default serves more requests/s there (results/log/gateway-notes.md). `load` gives the busy share (0..1,
    None when unknown); tests pass their own so that the decision does not depend on how busy the test machine is.
    """

    def __init__(self, short_us: int, busy: float = 0.85, period: float = 0.25,
                 load: Callable[[], float | None] | None = None):
        self.short_us, self.busy, self.period = short_us, busy, period
        self.load = load or MachineLoad()
        self.current = short_us
        ask_short_slice(short_us)
        if busy < 1:
            threading.Thread(target=self._run, name="reef-slice-governor", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            share = self.load()
            if share is None:
                continue
            want = 0 if share > self.busy else self.short_us if share < self.busy - 0.15 else self.current
            if want != self.current:
                self.current = want
                ask_short_slice(want)
                log.debug("worker %d: machine %.0f%% busy, time slice %s", os.getpid(), share * 100,
                          f"{want} us" if want else "the kernel's default")


def thread_slice_us(tid: int = 0) -> int | None:
    """The time slice the scheduler gives a thread in microseconds (its default, or what it asked for), or None
    where it cannot be read."""
    calls = _SCHED_SYSCALLS.get(os.uname().machine)
    if calls is None:
        return None
    buf = ctypes.create_string_buffer(_SCHED_ATTR.size)
    if ctypes.CDLL(None, use_errno=True).syscall(calls[1], tid, buf, _SCHED_ATTR.size, 0) != 0:
        return None
    return _SCHED_ATTR.unpack(buf.raw)[5] // 1000
