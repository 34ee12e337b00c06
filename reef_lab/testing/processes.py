"""Starting a server as a child process and waiting for it: the one helper the tests and the measuring scripts share
(`scripts/serve.py`, run by path from the checkout; the stub provider; the Hub double).

A child runs through reef_lab.procs.Popen (it and everything it starts die with the test process, `kill -9`
included), from the repository root, with its stderr in a log file (a pipe nobody reads during a run can fill and stall it), and counts as started when a
URL answers; if it exits or stays silent, the failure carries the log's tail.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reef_lab import procs
from reef_lab.testing import ROOT, free_port, serve_script


class Child:
    def __init__(self, proc: procs.Popen, port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        """The child's own pid (not its reaper's)."""
        return self.proc.child_pid

    @property
    def group(self) -> int:
        """The process group of the child's whole tree (its reaper's): `os.killpg(child.group, sig)` reaches all."""
        return self.proc.pid

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self, within: float = 30.0) -> float:
        """SIGTERM to the child; its whole tree SIGKILLed after `within` + 60 s. Returns the seconds it took."""
        t0 = time.monotonic()
        self.proc.stop(within + 60)
        return time.monotonic() - t0


def start_child(cmd: list[str], port: int, log: Path | None = None, env: dict | None = None,
                ready_path: str | None = "/healthz", timeout: float = 120.0, settle: float = 0.0,
                base_env: dict | None = None, cwd: str | Path | None = None) -> Child:
    """Start `cmd` (which listens on `port`, in `cwd`: default the repository root) and wait until GET `ready_path`
    answers (any status below 500; None: do not wait). Its environment: `base_env` (default: this process's)
    updated with `env`. `settle`: seconds more
    after it answers (a relay worker connects to its primary after the primary answers). Raises RuntimeError with
    the log's tail if it does not come up."""
    if log is None:
        log = Path(tempfile.mkstemp(prefix="reef-child-", suffix=".log")[1])
    with open(log, "ab") as err:
        proc = procs.Popen(cmd, cwd=cwd or ROOT, stdout=subprocess.DEVNULL, stderr=err,
                           env={**(os.environ if base_env is None else base_env), **(env or {})})
    child = Child(proc, port, log)
    if ready_path is None:
        return child
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", ready_path)
            if c.getresponse().status < 500:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            child.stop(0)
            raise RuntimeError(f"{' '.join(cmd[:3])} did not start on port {port}: {child.log_tail()}")
        time.sleep(0.1)
    time.sleep(settle)
    return child


def start_server(*args: str, data_dir: str | Path, log: Path | None = None, env: dict | None = None,
                 timeout: float = 120.0, port: int | None = None, base_env: dict | None = None) -> Child:
    """`scripts/serve.py --port P --data-dir D <args>`, started and answering /healthz (with several workers, the
    relay has had time to reach its primary)."""
    port = port or free_port()
    cmd = [sys.executable, str(serve_script()), "--port", str(port), "--data-dir", str(data_dir), *args]
    return start_child(cmd, port, log, env, timeout=timeout, settle=0.5 if "--workers" in args else 0.0,
                       base_env=base_env)


def start_stub(delay_ms: float = 0.0, log: Path | None = None) -> Child:
    """The stub provider (reef_lab/testing/stub_provider.py) as a child process, answering after `delay_ms`."""
    port = free_port()
    return start_child([sys.executable, "-m", "reef_lab.testing.stub_provider", "--port", str(port), "--delay-ms",
                        str(delay_ms)], port, log, ready_path="/v1/models")
