"""What the benchmarks (scripts/bench/) and studies (scripts/studies/) share, so each is written once (issue 51: the
same t-interval, percentile, pacing loop, machine probe and plotting set-up stood in several scripts, each a little
different). Not an entry point. A results page's command line and where its JSON goes are scripts/command_line.py's.

- `ROOT`: the repository root (the scripts run from it, as their relative defaults assume);
- statistics: `quantile`, `clopper_pearson` (a proportion); `mean_ci`, `t_interval` (reef_lab.experiments.stats);
- the machine a run measured on: `cpu_model`, `steal_ticks`, `RunInfo` (when, where, the CPU time the host took);
- load: `pace` (one client's paced cycles), `in_threads`, `spawn` (a load generator in a process of its own);
- servers: `wait_answering` (a started scripts/serve.py answers a chat: its model is loaded);
- figures: `pyplot` (matplotlib without a display).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import platform
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from reef_lab.experiments.stats import mean_ci, t_interval  # noqa: F401 - shared by the scripts

ROOT = Path(__file__).resolve().parents[1]

# ---- statistics ---------------------------------------------------------------------------------------------------
def quantile(xs: list[float], q: float) -> float:
    """The `q` quantile (0 to 1) of `xs` as the value at rank floor(q * n) of the sorted values (no interpolation:
    p99 of 100 values is the largest); nan for none."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _binom_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """Exact 95% interval of k successes in n (bisection on the binomial tails)."""
    def solve(f):
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) else (lo, mid)
        return (lo + hi) / 2
    lower = 0.0 if k == 0 else solve(lambda p: 1 - _binom_cdf(k - 1, n, p) < 0.025)
    upper = 1.0 if k == n else solve(lambda p: _binom_cdf(k, n, p) > 0.025)
    return lower, upper


# ---- the machine ------------------------------------------------------------------------------------------------
def steal_ticks() -> tuple[int, int]:
    """(steal, total) CPU ticks of the machine so far ((0, 0) where /proc/stat is missing).

    Why: on a VM the host can take CPU time away (steal); a run prints the share taken during it, since the same
    code measures very differently on a busy host.
    """
    from server.tuning import cpu_ticks

    f = cpu_ticks()
    return (f[7] if len(f) > 7 else 0), sum(f)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where it is missing).

    Why: the same VM image lands on different hosts; their disks and CPUs measured the gateway's added latency at
    0.46 ms on one and 0.7-1.8 ms on another, so each run names its CPU.
    """
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def utc_now(ts: float | None = None) -> str:
    """`YYYY-MM-DD HH:MM UTC` of `ts` (default: now), as the pages date their runs."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))


class RunInfo:
    """When and where a measured run ran: made at its start, `fields()` at its end gives `started`, `machine` (CPUs,
    their model, Python, platform) and `cpu_steal_share` (the share of the machine's CPU time the host took
    meanwhile)."""

    def __init__(self):
        self.started, self._ticks = utc_now(), steal_ticks()

    def fields(self) -> dict:
        (steal0, total0), (steal1, total1) = self._ticks, steal_ticks()
        return {"started": self.started, "cpu_steal_share": round((steal1 - steal0) / max(1, total1 - total0), 4),
                "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "python": platform.python_version(),
                            "platform": platform.platform()}}


# ---- load ---------------------------------------------------------------------------------------------------------
def pace(interval: float, seconds: float, rng: random.Random) -> Iterator[int]:
    """One client's cycles, one every `interval` s for `seconds`: the first after a random offset within one interval
    (drawn from `rng`, so clients seeded apart spread out), each later one on its own tick; a client that falls
    behind goes on at once until it is back on time (the rate in all is kept). Yields the cycle's number, from 1."""
    start = time.perf_counter()
    nxt, end, cycle = start + rng.uniform(0, interval), start + seconds, 0
    while True:
        now = time.perf_counter()
        if nxt > now:
            time.sleep(nxt - now)
        if time.perf_counter() > end:
            return
        cycle += 1
        yield cycle
        nxt += interval


def in_threads(run: Callable[[int], None], n: int) -> None:
    """`run(0)` ... `run(n - 1)`, each in a thread of its own, all at once; returns when all have."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _spawned(target: Callable, args: tuple, queue) -> None:
    from reef_lab import procs

    procs.die_with_parent()  # gone with the script that spawned it, kill -9 included
    queue.put(target(*args))


def spawn(target: Callable, *args) -> tuple[mp.Process, mp.Queue]:
    """`target(*args)` started in a fresh interpreter (so a load generator's CPU use shares no GIL with the process
    that samples the server), dying with this process; its return value comes on the queue (get it before `join`).
    `target` is a module-level function of an importable module."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_spawned, args=(target, args, queue))
    process.start()
    return process, queue


# ---- servers ------------------------------------------------------------------------------------------------------
def wait_answering(url: str, server, log: Path, timeout: float = 900) -> None:
    """Block until the scripts/serve.py at `url` (the child `server`, writing `log`) answers a chat completion: its
    model is loaded. Raises with the log's tail if it exits first, or after `timeout` s."""
    import requests

    deadline = time.monotonic() + timeout
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"serve.py exited with {server.returncode}: {log.read_text()[-3000:]}")
        try:
            r = requests.post(url + "/v1/chat/completions", json=body, headers={"x-reef-scenario": "warmup"},
                              timeout=600)
            if r.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(2)
    raise RuntimeError(f"serve.py did not answer within {timeout:.0f} s")


# ---- figures ------------------------------------------------------------------------------------------------------
def pyplot():
    """matplotlib.pyplot drawing to files only (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
