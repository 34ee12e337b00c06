"""Run a candidate Python program, written by the model under training, inside a bubblewrap sandbox with CPU,
memory, output, disk and wall-time limits.

Why: TTT-Discover scores what the model writes by running it, and a policy under RL finds whatever its reward lets it
reach: a candidate that loops, eats memory, crashes, floods stdout or prints nonsense must score as invalid, and a
hostile one must reach nothing of the machine. With `isolation="bwrap"` (the default) each candidate runs under
bubblewrap (`apt-get install bubblewrap`):

- new user, pid, network, IPC, UTS and cgroup namespaces: an unprivileged uid (65534) without capabilities, its own
  /proc that shows only its own processes (not the server's, nor their environment), no network but its own
  loopback; `--die-with-parent` and `--new-session`; nested user namespaces disabled (bubblewrap >= 0.8);
- a filesystem of read-only binds of what Python needs (/usr, /lib*, the interpreter's install and the venv) and a
  fresh tmpfs at /tmp (its home and working directory, `disk_mb` large), nothing else of the host;
- an empty environment (`--clearenv`, then only locale, thread counts and PATH);
- a seccomp filter refusing new processes and threads (clone, clone3, fork, vfork) unless `allow_processes`, and
  always unshare, setns, ptrace, the kernel keyring and io_uring. As root the kernel ignores RLIMIT_NPROC (the uid
  inside maps to the caller's), so the filter is what stops forks; the pid namespace takes every process of the
  candidate down with its verdict (its init exits when the candidate does, or is killed at the wall clock);
- these limits, set by a small bootstrap before the candidate's first line runs (soft = hard, so it cannot raise
  them): RLIMIT_CPU (SIGXCPU, then SIGKILL one second later), RLIMIT_AS (MemoryError), RLIMIT_FSIZE (stdout goes
  to a file the caller opened outside the sandbox and reads back through its own descriptor, never by name),
  RLIMIT_NPROC 0 unless `allow_processes` (effective when the server is not root), RLIMIT_CORE 0; and a wall-clock
  timeout after which the sandbox is killed.

`isolation="none"` runs the same bootstrap as a plain child process (`python -I`, empty environment, the limits
above, its own temporary directory) with the server's user and view of the machine: the operator's explicit choice
(`problem.sandbox: none`) where bubblewrap cannot run, logged once. `check_isolation(limits)` probes bubblewrap and
raises `SandboxUnavailable` naming the fix when it cannot run; problems that run code call it when they are built.

`run_python(code, limits)` returns a `SandboxResult`: kind "ok", "timeout", "memory", "crash", "output" (over the
output cap) or "garbage" (output that is not UTF-8); a problem's parser marks unparseable output as garbage too.
Overhead of bubblewrap per run: recipes/tttd/README.md ("The sandbox").
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("recipes.tttd.sandbox")

KINDS = ("ok", "timeout", "memory", "crash", "output", "garbage")
ISOLATIONS = ("bwrap", "none")
INSTALL_HINT = "install bubblewrap (as root: apt-get install bubblewrap; scripts/setup.sh does)"

# Reads the candidate from stdin into its own directory, tells the caller (through the `ready` pipe) that the
# sandbox stands, sets the limits and runs the candidate.
_BOOT = """\
import os, resource, runpy, sys
ready, cpu, mem, out, nproc = (int(a) for a in sys.argv[1:6])
os.write(ready, b"1")
os.close(ready)
with open("candidate.py", "wb") as f:
    f.write(sys.stdin.buffer.read())
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (out, out))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
if nproc >= 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = ["candidate.py"]
del ready, cpu, mem, out, nproc, resource, f, null
runpy.run_path("candidate.py", run_name="__main__")
"""


class SandboxUnavailable(ValueError):
    """The sandbox cannot run on this machine (a set-up error, never a candidate's doing)."""


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_mb: int = 512
    output_bytes: int = 64 * 1024
    allow_processes: bool = False
    isolation: str = "bwrap"  # one of ISOLATIONS
    disk_mb: int = 16  # size of the sandbox's own /tmp (bwrap)

    def __post_init__(self) -> None:
        if self.cpu_seconds < 1 or self.wall_seconds <= 0 or self.memory_mb < 64 or self.output_bytes < 1:
            raise ValueError("sandbox limits: cpu_seconds >= 1, wall_seconds > 0, memory_mb >= 64 (the interpreter "
                             "itself needs tens of MB) and output_bytes >= 1")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"sandbox isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.disk_mb < 1:
            raise ValueError(f"sandbox disk_mb must be >= 1, got {self.disk_mb}")


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


_LOCALE = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _env(home: str) -> dict[str, str]:
    return {"PATH": os.defpath, "HOME": home, "TMPDIR": home, **_LOCALE}


# --- seccomp -------------------------------------------------------------------------------------------------------

_ARCHES = {  # machine: (AUDIT_ARCH_*, process-creating syscalls, always refused, has the x32 ABI to refuse)
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58, "clone3": 435},
               {"ptrace": 101, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308,
                "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}, True),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435},
                {"ptrace": 117, "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268,
                 "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}, False),
}
_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000


def seccomp_filter(allow_processes: bool, machine: str | None = None) -> bytes:
    """A classic-BPF seccomp program (what `bwrap --seccomp` loads): another architecture's syscalls kill the
    process; the refused calls fail with EPERM; everything else is allowed."""
    arch, spawn, always, x32 = _ARCHES[machine or platform.machine()]
    refused = sorted({*always.values(), *([] if allow_processes else spawn.values())})
    head = [(_LD_W_ABS, 0, 0, 4), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL_PROCESS), (_LD_W_ABS, 0, 0, 0)]
    checks = ([(_JGE, 0x40000000)] if x32 else []) + [(_JEQ, nr) for nr in refused]
    errno_at = len(head) + len(checks) + 1
    prog = head + [(op, errno_at - (len(head) + i) - 1, 0, k) for i, (op, k) in enumerate(checks)]
    prog += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | 1)]  # 1: EPERM
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


# --- bubblewrap ----------------------------------------------------------------------------------------------------

@functools.cache
def _bwrap() -> tuple[str | None, tuple[int, ...]]:
    path = shutil.which("bwrap")
    if path is None:
        return None, ()
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return path, tuple(int(g or 0) for g in m.groups()) if m else ()


def _python_dirs(python: str) -> list[str]:
    """The folders the interpreter needs: its install and, for a venv's python, the venv (its site-packages)."""
    dirs = {sys.base_prefix, sys.prefix} if python == sys.executable else set()
    dirs |= {str(Path(python).absolute().parents[1]), str(Path(python).resolve().parents[1])}
    return sorted(d for d in dirs if d != "/" and not any(d == s or d.startswith(s + "/") for s in ("/usr",)))


def _bwrap_args(python: str, limits: Limits, seccomp_fd: int) -> list[str]:
    bwrap, version = _bwrap()
    args = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--uid", "65534", "--gid", "65534",
            "--hostname", "sandbox", "--clearenv"]
    for key, value in _env("/tmp").items():
        args += ["--setenv", key, value]
    args += ["--size", str(limits.disk_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp", "--proc", "/proc",
             "--dev", "/dev", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for d in _python_dirs(python):
        args += ["--ro-bind", d, d]
    if version >= (0, 8):
        args += ["--disable-userns"]
    return args + ["--seccomp", str(seccomp_fd), "--"]


@functools.cache
def _probe(python: str) -> str:
    """'' when bubblewrap runs a candidate here, else why not."""
    bwrap, version = _bwrap()
    if bwrap is None:
        return "bwrap is not installed"
    if platform.machine() not in _ARCHES:
        return f"its seccomp filter knows x86_64 and aarch64, not {platform.machine()}"
    try:
        r = run_python("print('ok')", Limits(cpu_seconds=10, wall_seconds=60.0), python)
    except SandboxUnavailable as e:
        return str(e)
    return "" if r.stdout == "ok\n" else f"a test program gave {r.kind}: {r.detail[-300:]}"


@functools.cache
def _warn_unisolated() -> None:
    log.warning("problem.sandbox is 'none' (the operator's choice): candidate programs run as this server's user "
                "with its view of the machine, limited only in CPU, memory, output and time")


def check_isolation(limits: Limits, python: str | None = None) -> None:
    """Raise SandboxUnavailable naming the fix when `limits.isolation` cannot run here (probed once per process);
    log once that candidates run without isolation when the operator chose `none`."""
    if limits.isolation == "none":
        _warn_unisolated()
        return
    why = _probe(python or sys.executable)
    if why:
        raise SandboxUnavailable(
            f"the TTT sandbox (bubblewrap) cannot run here: {why}. Fix: {INSTALL_HINT}; or, only for models you "
            "trust, run candidates without isolation with problem: {sandbox: none} in the server's --recipe-config "
            "(or the experiment's config)")


# --- running a candidate -------------------------------------------------------------------------------------------

def _tail(f, limit: int = 2000) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace").strip()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone: nothing left to kill
        return


def run_python(code: str, limits: Limits | None = None, python: str | None = None) -> SandboxResult:
    """Run `code` as a script under `limits`; never raises for anything the candidate does (SandboxUnavailable when
    the sandbox itself cannot start)."""
    limits = limits or Limits()
    python = python or sys.executable
    started = time.perf_counter()
    ready_r, ready_w = os.pipe()
    fds = [ready_w]
    # The caller's own folder (the candidate's source, stdout, stderr): with bwrap the candidate never sees it.
    with tempfile.TemporaryDirectory(prefix="tttd-sandbox-") as tmp:
        private = Path(tmp)
        (private / "source.py").write_text(code, encoding="utf-8")
        boot = [python, "-I", "-c", _BOOT, str(ready_w), str(limits.cpu_seconds), str(limits.memory_mb << 20),
                str(limits.output_bytes), "-1" if limits.allow_processes else "0"]
        if limits.isolation == "bwrap":
            if _bwrap()[0] is None:
                raise SandboxUnavailable(f"bwrap is not installed: {INSTALL_HINT}")
            filter_r, filter_w = os.pipe()
            os.write(filter_w, seccomp_filter(limits.allow_processes))
            os.close(filter_w)
            fds.append(filter_r)
            args, cwd, env = _bwrap_args(python, limits, filter_r) + boot, private, {"PATH": os.defpath}
        else:
            (private / "work").mkdir()
            args, cwd, env = boot, private / "work", _env(str(private / "work"))
        try:
            with open(private / "source.py", "rb") as source, open(private / "stdout", "w+b") as out, \
                    open(private / "stderr", "w+b") as err:
                proc = subprocess.Popen(args, cwd=cwd, env=env, stdin=source, stdout=out, stderr=err,
                                        start_new_session=True, pass_fds=fds)
                for fd in fds:
                    os.close(fd)
                fds = []
                try:
                    returncode = proc.wait(timeout=limits.wall_seconds)
                    timed_out = False
                except subprocess.TimeoutExpired:
                    _kill_group(proc.pid)  # bwrap: its sandbox dies with it (--die-with-parent, pid namespace)
                    returncode = proc.wait()
                    timed_out = True
                _kill_group(proc.pid)  # anything the candidate left running in its group (isolation none)
                seconds = time.perf_counter() - started
                out.seek(0)
                raw, err_tail = out.read(), _tail(err)
        finally:
            for fd in fds:
                os.close(fd)
            fcntl.fcntl(ready_r, fcntl.F_SETFL, os.O_NONBLOCK)
            try:
                ready = os.read(ready_r, 1) == b"1"
            except BlockingIOError:  # no byte and a writer still open: the sandbox never stood
                ready = False
            os.close(ready_r)
    if not ready and not timed_out:
        raise SandboxUnavailable(f"the sandbox did not start (exit status {returncode}): {err_tail[-1000:]}")
    if limits.isolation == "bwrap" and returncode is not None and returncode > 128:
        returncode = 128 - returncode  # bwrap reports a signal's death as 128 + signal, like a shell
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
