"""Run a candidate Python program in a child process with CPU, memory, output and wall-time limits.

Why: TTT-Discover scores what the model writes by running it. A candidate that loops, eats memory, crashes, floods
stdout or prints nonsense must score as invalid and never take the run down, so each one runs in its own process:
`python -I` (no user site, no PYTHONPATH, no current directory on the path) in a fresh temporary directory that is
deleted afterwards, with an environment that holds nothing of the parent's (no tokens or keys), stdin closed, and
these limits set by a small bootstrap before the candidate's first line runs (soft = hard, so it cannot raise them):

- RLIMIT_CPU: CPU seconds (SIGXCPU, then SIGKILL one second later);
- RLIMIT_AS: address space (allocations fail with MemoryError);
- RLIMIT_FSIZE: bytes any one file may reach, stdout included (stdout goes to a file, not a pipe);
- RLIMIT_NPROC 0 unless `allow_processes`: no threads or child processes (the kernel ignores it for root);
- RLIMIT_CORE 0; and a wall-clock timeout after which the whole process group is killed (a sleeping or blocked
  candidate uses no CPU time).

This contains accidents and a small model's mistakes; it is not a security boundary against hostile code (no
filesystem or network isolation): run untrusted generators inside a container or VM.

`run_python(code)` returns a `SandboxResult`: kind "ok", "timeout", "memory", "crash", "output" (over the output cap)
or "garbage" (output that is not UTF-8); a problem's parser marks unparseable output as garbage too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

KINDS = ("ok", "timeout", "memory", "crash", "output", "garbage")

_BOOT = """\
import resource, runpy, sys
cpu, mem, out, nproc = (int(a) for a in sys.argv[1:5])
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (out, out))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
if nproc >= 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = sys.argv[5:]
del cpu, mem, out, nproc, resource
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_mb: int = 512
    output_bytes: int = 64 * 1024
    allow_processes: bool = False

    def __post_init__(self) -> None:
        if self.cpu_seconds < 1 or self.wall_seconds <= 0 or self.memory_mb < 64 or self.output_bytes < 1:
            raise ValueError("sandbox limits: cpu_seconds >= 1, wall_seconds > 0, memory_mb >= 64 (the interpreter "
                             "itself needs tens of MB) and output_bytes >= 1")


@dataclass(frozen=True)
class SandboxResult:
    kind: str  # one of KINDS
    stdout: str  # decoded stdout (empty unless it was UTF-8)
    detail: str  # why it failed: the last lines of stderr, or the limit that was hit
    returncode: int | None
    seconds: float  # wall time

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def _env(home: str) -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


def _tail(path: Path, limit: int = 2000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-limit:].decode("utf-8", errors="replace").strip()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone: nothing left to kill
        return


def run_python(code: str, limits: Limits | None = None, python: str | None = None) -> SandboxResult:
    """Run `code` as a script under `limits`; never raises for anything the candidate does."""
    limits = limits or Limits()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tttd-sandbox-") as tmp:
        work = Path(tmp)
        script = work / "candidate.py"
        script.write_text(code, encoding="utf-8")
        out_path, err_path = work / "stdout", work / "stderr"
        args = [python or sys.executable, "-I", "-c", _BOOT, str(limits.cpu_seconds), str(limits.memory_mb << 20),
                str(limits.output_bytes), "-1" if limits.allow_processes else "0", str(script)]
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(args, cwd=work, env=_env(tmp), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True)
            try:
                returncode = proc.wait(timeout=limits.wall_seconds)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                returncode = proc.wait()
                timed_out = True
            _kill_group(proc.pid)  # anything the candidate left running in its group
        seconds = time.perf_counter() - started
        raw, err_tail = out_path.read_bytes(), _tail(err_path)
    kind, detail = _classify(returncode, timed_out, len(raw), err_tail, limits)
    if kind == "ok":
        try:
            stdout = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return SandboxResult("garbage", "", f"stdout is not UTF-8 ({e})", returncode, seconds)
        return SandboxResult("ok", stdout, "", returncode, seconds)
    return SandboxResult(kind, "", detail, returncode, seconds)


def _classify(returncode: int, timed_out: bool, out_bytes: int, err: str, limits: Limits) -> tuple[str, str]:
    if timed_out:
        return "timeout", f"killed after {limits.wall_seconds:g} s of wall time"
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout", f"killed after {limits.cpu_seconds} s of CPU time (signal {-returncode})"
    if out_bytes >= limits.output_bytes or "File too large" in err or returncode == -signal.SIGXFSZ:
        return "output", f"output reached the {limits.output_bytes}-byte cap"
    if "MemoryError" in err or "Cannot allocate memory" in err:
        return "memory", f"over the {limits.memory_mb} MB address-space limit: {err[-300:]}"
    if returncode != 0:
        return "crash", f"exit status {returncode}: {err[-1000:]}" if err else f"exit status {returncode}"
    return "ok", ""
