"""Run a candidate Python program, written by the model under training, inside a bubblewrap sandbox with CPU,
memory, output, disk and wall-time limits.

Why: TTT-Discover scores what the model writes by running it, and a policy under RL finds whatever its reward lets it
reach: a candidate that loops, eats memory, crashes, floods stdout or prints nonsense must score as invalid, and a
hostile one must reach nothing of the machine. With `isolation="bwrap"` (the default) each candidate runs under
bubblewrap (`apt-get install bubblewrap`):

- the candidate is nobody (uid and gid 65534) with no capability, also outside the sandbox: as root, bubblewrap
  would map a user namespace's uid to root outside (a candidate could then write /proc/sys: kernel.core_pattern
  names a program the kernel runs as root), so a root server's bubblewrap makes no user namespace and ends in
  `setpriv`, which drops to nobody and empties every capability set (bounding set included) before Python starts;
  a server that is not root gets a user namespace mapping 65534 to its own uid, with nested ones disabled
  (bubblewrap >= 0.8). `--cap-drop ALL` either way (as root bwrap keeps only setpriv's three);
- new pid, network, IPC, UTS and cgroup namespaces: its own /proc (read-only) that shows only its own processes
  (not the server's, nor their environment), no network but its own loopback; `--die-with-parent`, `--new-session`;
- a read-only filesystem: / and /dev are remounted read-only, with binds of what Python needs (/usr, /lib*, the
  interpreter's install and the venv); the only writable places are /tmp (its home and working directory) and
  /dev/shm, tmpfs of `disk_mb` and `disk_inodes` files and folders each (a write or a new file past either fails
  with ENOSPC); nothing else of the host;
- an empty environment (`--clearenv`, then only locale, thread counts and PATH);
- a seccomp filter refusing new processes and threads (clone, fork, vfork) unless `allow_processes`, a clone that
  makes a namespace even then, clone3 (ENOSYS: its flags are out of a filter's reach, and glibc falls back to
  clone), and always unshare, setns, ptrace, the kernel keyring and io_uring; the pid namespace takes every process
  of the candidate down with its verdict (its init exits when the candidate does, or is killed at the wall clock);
- these limits, set by a small bootstrap before the candidate's first line runs (soft = hard, so it cannot raise
  them): RLIMIT_CPU (SIGXCPU, then SIGKILL one second later), RLIMIT_AS (MemoryError), RLIMIT_FSIZE (stdout goes
  to a file the caller opened outside the sandbox and reads back through its own descriptor, never by name),
  RLIMIT_NPROC 0 unless `allow_processes`, RLIMIT_CORE 0, RLIMIT_NOFILE 64; and a wall-clock timeout after which
  the sandbox is killed.

Why the writable folders are not bubblewrap's own `--tmpfs`: it takes a size (`--size`) but no inode count (none up
to bubblewrap 0.11.1), and a tmpfs's size bounds its blocks, not its inodes, which default to half the RAM's pages:
a candidate creating empty files pinned about 300 MB of kernel memory, four at once about 692 MB (issue 50). No
rlimit counts files, the candidate has no capability to mount one itself, and a cgroup's memory limit (which would
count the inodes) needs a delegated cgroup that a server often does not have. So util-linux's `unshare` makes a
mount namespace for the one run (a server that is not root gets it in a user namespace where it is root, from the
same unprivileged user namespaces bubblewrap needs; bubblewrap then makes its own inside it), `mount` puts the two
tmpfs with `size=` and `nr_inodes=` on empty folders of the caller's private directory there, and bubblewrap,
started in that namespace, binds them at /tmp and /dev/shm. The host never sees these mounts; they go when the run's
last process does. Measured here: 300,000 empty files pinned 299 MB of slab before; now 4,094 fit (`disk_inodes`
4096) and the slab did not grow by a megabyte. A setuid bubblewrap on a machine without unprivileged user
namespaces cannot run this: `check_isolation` says so at start.

`isolation="none"` runs the same bootstrap as a plain child process (`python -I`, empty environment, the limits
above, its own temporary directory, no disk bound but RLIMIT_FSIZE per file) with the server's user and view of the
machine: the operator's explicit choice (`problem.sandbox: none`) where bubblewrap cannot run, logged once.
`check_isolation(limits)` probes bubblewrap (and, as root, setpriv) and raises `SandboxUnavailable` naming the fix
when it cannot run; problems that run code call it when they are built.

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
UTIL_LINUX_HINT = "install util-linux (as root: apt-get install util-linux)"
_UTIL_LINUX_NEEDS = {"setpriv": "to run candidates as nobody when the server is root",
                     "unshare": "to mount the candidate's writable folders with an inode bound",
                     "mount": "to mount the candidate's writable folders with an inode bound"}
NOBODY = 65534  # the candidate's uid and gid, inside the sandbox and outside it

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
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
if nproc >= 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = ["candidate.py"]
del ready, cpu, mem, out, nproc, resource, f, null
runpy.run_path("candidate.py", run_name="__main__")
"""


class SandboxUnavailable(ValueError):
    """The sandbox cannot run on this machine (a set-up error, never a candidate's doing)."""


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 10
    wall_seconds: float = 20.0
    memory_mb: int = 512
    output_bytes: int = 64 * 1024
    allow_processes: bool = False
    isolation: str = "bwrap"  # one of ISOLATIONS
    disk_mb: int = 16  # size of the sandbox's /tmp and of its /dev/shm, each (bwrap)
    disk_inodes: int = 4096  # files and folders the sandbox's /tmp and its /dev/shm may hold, each (bwrap)

    def __post_init__(self) -> None:
        if self.cpu_seconds < 1 or self.wall_seconds <= 0 or self.memory_mb < 64 or self.output_bytes < 1:
            raise ValueError("sandbox limits: cpu_seconds >= 1, wall_seconds > 0, memory_mb >= 64 (the interpreter "
                             "itself needs tens of MB) and output_bytes >= 1")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"sandbox isolation must be one of {ISOLATIONS}, got {self.isolation!r}")
        if self.disk_mb < 1:
            raise ValueError(f"sandbox disk_mb must be >= 1, got {self.disk_mb}")
        if self.disk_inodes < 16:
            raise ValueError(f"sandbox disk_inodes must be >= 16 (the folder itself and the candidate's source "
                             f"count), got {self.disk_inodes}")


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

_ARCHES = {  # machine: (AUDIT_ARCH_*, process-creating syscalls but clone3, always refused, has the x32 ABI to refuse)
    "x86_64": (0xC000003E, {"clone": 56, "fork": 57, "vfork": 58},
               {"ptrace": 101, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308,
                "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68}, True),
    "aarch64": (0xC00000B7, {"clone": 220},
                {"ptrace": 117, "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268,
                 "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                 "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "msgget": 186}, False),
}
# memfd_create, memfd_secret, shmget and msgget: memory outside RLIMIT_AS and the bounded mounts (a memfd is only
# bounded by RLIMIT_FSIZE times the open-file limit); a circle program needs none of them.
_CLONE3 = 435  # the same number on both
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME: a new user namespace would give the
# candidate capabilities in it (an unbounded tmpfs of its own, for one)
_CLONE_NEW_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_EPERM, _ENOSYS = 1, 38


def seccomp_filter(allow_processes: bool, machine: str | None = None) -> bytes:
    """A classic-BPF seccomp program (what `bwrap --seccomp` loads): another architecture's syscalls kill the
    process; the refused calls fail with EPERM; clone3 fails with ENOSYS (its flags lie in memory a filter cannot
    read; glibc then falls back to clone); where processes are allowed, a clone that makes a namespace fails with
    EPERM; everything else is allowed."""
    arch, spawn, always, x32 = _ARCHES[machine or platform.machine()]
    refused = sorted({*always.values(), *([] if allow_processes else spawn.values())})
    # (op, k, where to go if true, if false): a label, or None for the next instruction
    prog = [(_LD_W_ABS, 4, None, None), (_JEQ, arch, None, "kill"), (_LD_W_ABS, 0, None, None)]
    prog += [(_JGE, 0x40000000, "eperm", None)] if x32 else []
    prog += [(_JEQ, nr, "eperm", None) for nr in refused] + [(_JEQ, _CLONE3, "enosys", None)]
    prog += [(_JEQ, spawn["clone"], "clone", None)] if allow_processes else []
    tail = {"allow": (_RET, _ALLOW, None, None), "clone": (_LD_W_ABS, 16, None, None),  # clone's flags (low word)
            "new_namespace?": (_JSET, _CLONE_NEW_NAMESPACES, "eperm", None), "allow_clone": (_RET, _ALLOW, None, None),
            "kill": (_RET, _KILL_PROCESS, None, None), "eperm": (_RET, _ERRNO | _EPERM, None, None),
            "enosys": (_RET, _ERRNO | _ENOSYS, None, None)}
    labels = {name: len(prog) + i for i, name in enumerate(tail)}
    prog += tail.values()

    def jump(at: int, to: str | None) -> int:
        return 0 if to is None else labels[to] - at - 1
    return b"".join(struct.pack("=HBBI", op, jump(i, t), jump(i, f), k) for i, (op, k, t, f) in enumerate(prog))


# --- bubblewrap ----------------------------------------------------------------------------------------------------

@functools.cache
def _bwrap() -> tuple[str | None, tuple[int, ...]]:
    path = shutil.which("bwrap")
    if path is None:
        return None, ()
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out)
    return path, tuple(int(g or 0) for g in m.groups()) if m else ()


@functools.cache
def _util_linux(name: str) -> str:
    path = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxUnavailable(f"{name} is not installed, which the sandbox needs {_UTIL_LINUX_NEEDS[name]}: "
                                 f"{UTIL_LINUX_HINT}")
    return path


# Run by `sh -c` in the run's own mount namespace: mount "$1", options "$2", on "$3" and "$4", then bubblewrap.
_MOUNT_THEN = '"$1" -t tmpfs -o "$2" tmpfs "$3" && "$1" -t tmpfs -o "$2" tmpfs "$4" && shift 4 && exec "$@"'


def _mounts_args(limits: SandboxLimits, tmp: Path, shm: Path) -> list[str]:
    """The command line that mounts the bounded tmpfs on `tmp` and `shm` in a mount namespace of its own (and, for
    a server that is not root, a user namespace mapping it to root) and then runs what follows it: bubblewrap."""
    unshare = [_util_linux("unshare"), "--mount", "--propagation", "private"]
    unshare += [] if os.geteuid() == 0 else ["--map-root-user"]
    options = f"mode=1777,size={limits.disk_mb << 20},nr_inodes={limits.disk_inodes},nosuid,nodev"
    return [*unshare, "--", "/bin/sh", "-c", _MOUNT_THEN, "sh", _util_linux("mount"), options, str(tmp), str(shm)]


def _python_dirs(python: str) -> list[str]:
    """The folders the interpreter needs: its install and, for a venv's python, the venv (its site-packages)."""
    dirs = {sys.base_prefix, sys.prefix} if python == sys.executable else set()
    dirs |= {str(Path(python).absolute().parents[1]), str(Path(python).resolve().parents[1])}
    return sorted(d for d in dirs if d != "/" and not any(d == s or d.startswith(s + "/") for s in ("/usr",)))


def _bwrap_args(python: str, limits: SandboxLimits, seccomp_fd: int, tmp: Path, shm: Path) -> list[str]:
    """bubblewrap's command line, after the one that mounts the writable folders on `tmp` and `shm`; as root it ends
    in setpriv's, which makes the candidate nobody (see the docstring)."""
    bwrap, version = _bwrap()
    nobody = str(NOBODY)
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox", "--clearenv"]
    as_root = os.geteuid() == 0
    if as_root:  # the three capabilities setpriv needs to drop to nobody, and nothing else
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        args += ["--unshare-user", "--uid", nobody, "--gid", nobody]
        args += ["--disable-userns"] if version >= (0, 8) else []
    for key, value in _env("/tmp").items():
        args += ["--setenv", key, value]
    args += ["--bind", str(tmp), "/tmp", "--chdir", "/tmp",
             "--proc", "/proc", "--remount-ro", "/proc",
             "--dev", "/dev", "--bind", str(shm), "/dev/shm", "--remount-ro", "/dev",
             "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for d in _python_dirs(python):  # --dir first: bubblewrap 0.8 makes a bind's missing parents 0700, root's
        args += ["--perms", "0755", "--dir", d, "--ro-bind", d, d]
    args += ["--remount-ro", "/", "--seccomp", str(seccomp_fd), "--"]
    if as_root:
        args += [_util_linux("setpriv"), "--reuid", nobody, "--regid", nobody, "--clear-groups", "--inh-caps", "-all",
                 "--bounding-set", "-all", "--"]
    return _mounts_args(limits, tmp, shm) + args


@functools.cache
def _probe(python: str) -> str:
    """'' when bubblewrap runs a candidate here, else why not."""
    bwrap, version = _bwrap()
    if bwrap is None:
        return "bwrap is not installed"
    if platform.machine() not in _ARCHES:
        return f"its seccomp filter knows x86_64 and aarch64, not {platform.machine()}"
    try:
        r = run_python("print('ok')", SandboxLimits(cpu_seconds=10, wall_seconds=60.0), python)
    except SandboxUnavailable as e:
        return str(e)
    return "" if r.stdout == "ok\n" else f"a test program gave {r.kind}: {r.detail[-300:]}"


@functools.cache
def _warn_unisolated() -> None:
    log.warning("problem.sandbox is 'none' (the operator's choice): candidate programs run as this server's user "
                "with its view of the machine, limited only in CPU, memory, output and time")


def check_isolation(limits: SandboxLimits, python: str | None = None) -> None:
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


def run_python(code: str, limits: SandboxLimits | None = None, python: str | None = None) -> SandboxResult:
    """Run `code` as a script under `limits`; never raises for anything the candidate does (SandboxUnavailable when
    the sandbox itself cannot start)."""
    limits = limits or SandboxLimits()
    python = python or sys.executable
    if limits.isolation == "bwrap":
        if _bwrap()[0] is None:
            raise SandboxUnavailable(f"bwrap is not installed: {INSTALL_HINT}")
        for name in ("unshare", "mount") + (("setpriv",) if os.geteuid() == 0 else ()):
            _util_linux(name)
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
            filter_r, filter_w = os.pipe()
            os.write(filter_w, seccomp_filter(limits.allow_processes))
            os.close(filter_w)
            fds.append(filter_r)
            (private / "tmp").mkdir()
            (private / "shm").mkdir()
            args = _bwrap_args(python, limits, filter_r, private / "tmp", private / "shm") + boot
            cwd, env = private, {"PATH": os.defpath}
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


def _classify(returncode: int, timed_out: bool, out_bytes: int, err: str, limits: SandboxLimits) -> tuple[str, str]:
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
