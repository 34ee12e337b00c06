"""Child processes that die with their parent, with everything they started, `kill -9` of the parent included.

Why: `kill -9` of `scripts/serve.py --engine vllm` left the vLLM API server, its EngineCore and its Worker (3.6 GB
resident) running as orphans (issue 28). Every process reef_lab starts goes through `Popen` here.

How: `Popen(args, ...)` takes subprocess.Popen's arguments but starts a small reaper (this file, run as a script
with `python -I -S`), which starts `args`:

- The reaper leads its own session and process group and is a child subreaper (PR_SET_CHILD_SUBREAPER): the child
  and everything below it stay below the reaper, in whatever session, orphans included (the kernel reparents them to
  the reaper instead of init), so it can find them all by walking /proc.
- It holds the read end of a pipe whose only write end is the parent's (the lifeline). The kernel closes that end
  when the parent process dies, however it dies, so the reaper reads EOF and SIGKILLs every process below it.
  A pipe, not PR_SET_PDEATHSIG on the reaper: PDEATHSIG fires when the *thread* that forked exits (the vLLM engine
  restarts its server from its supervisor thread; a child started from a short-lived thread would be killed at
  once), and it would not reach vLLM's grandchildren, which do not inherit it. A pipe closes only with the process.
- The child gets PR_SET_PDEATHSIG=SIGKILL with the single-threaded reaper as its parent: if someone kills the
  reaper itself with -9, the child goes too.
- When the child exits, what it left behind gets SIGTERM, then SIGKILL after `grace` seconds; the reaper then exits
  as the child did (its code, or the same signal), so `returncode` reads as subprocess.Popen's would.

The caller's handle: `send_signal`/`terminate` reach the child (the reaper passes them on), `kill()` SIGKILLs the
whole tree, `child_pid` is the child's pid, `pid` the reaper's (the process group of the tree). `detached=True`
has no lifeline: the child outlives its launcher (the experiment runs the apps start, see
apps/launch.py), but nothing it starts outlives the child, and `kill()` still takes the tree.

Processes started by something else (granian's workers, multiprocessing children) call `die_with_parent()` first.
Linux only (prctl, /proc), as the rest of reef_lab's process handling.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
KILL_TREE = signal.SIGRTMIN + 1  # to the reaper: SIGKILL everything below you, then yourself
_REAPER = os.path.abspath(__file__)


def _prctl(option: int, arg: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg}): {os.strerror(err)}")


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL this process when its parent thread exits (PR_SET_PDEATHSIG); exit now if the parent is gone already
    (`parent`: the pid it must have; default: any but init). For a process started by code that is not reef_lab's
    (granian, multiprocessing), from its main thread, first thing."""
    if not sys.platform.startswith("linux"):
        return
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    ppid = os.getppid()
    if (parent is not None and ppid != parent) or ppid == 1:  # the parent died before prctl took effect
        os._exit(1)


class Popen(subprocess.Popen):
    """subprocess.Popen whose child, and everything the child starts, dies with this process (module docstring).

    Takes Popen's arguments except shell, executable, preexec_fn, start_new_session and process_group (the reaper
    chooses the session); `grace`: seconds the child's leftovers get between SIGTERM and SIGKILL once it has exited;
    `new_session=False` leaves the reaper and the child in the caller's process group, so a signal to that group
    (a supervisor's SIGTERM, or SIGKILL) reaches the child at once (serve.py's workers)."""

    def __init__(self, args, *, detached: bool = False, new_session: bool = True, grace: float = 5.0, pass_fds=(),
                 **kwargs):
        for name in ("shell", "executable", "preexec_fn", "start_new_session", "process_group"):
            if kwargs.get(name):
                raise ValueError(f"reef_lab.procs.Popen does not take {name}: the reaper starts the child itself")
        if isinstance(args, (str, bytes)):
            raise ValueError("reef_lab.procs.Popen takes a list of arguments, not a command string")
        args = [os.fsdecode(a) for a in args]
        status_r, status_w = os.pipe()
        life_r, self._lifeline = os.pipe() if not detached else (-1, None)
        keep = [int(fd) for fd in pass_fds]
        argv = [sys.executable, "-I", "-S", _REAPER, str(status_w), str(life_r), repr(float(grace)),
                ",".join(map(str, keep)), *args]
        try:
            super().__init__(argv, pass_fds=(*keep, status_w, *([life_r] if life_r >= 0 else [])),
                             start_new_session=new_session, **kwargs)
        except BaseException:
            for fd in (status_r, self._lifeline):
                if fd is not None:
                    os.close(fd)
            self._lifeline = None
            raise
        finally:
            os.close(status_w)
            if life_r >= 0:
                os.close(life_r)
        status = b""
        try:  # one line; not up to EOF, which a process forked meanwhile (without exec) could hold off
            while not status.endswith(b"\n") and (part := os.read(status_r, 4096)):
                status += part
        finally:
            os.close(status_r)
        kind, _, rest = status.decode(errors="replace").strip().partition(" ")
        self.args, self.new_session = args, new_session
        if kind == "ok":
            self.child_pid = int(rest)
            return
        self.wait()
        if kind == "err":
            err, _, msg = rest.partition(" ")
            msg, _, filename = msg.partition("\0")
            raise OSError(int(err), msg, filename)
        raise ChildProcessError(f"reef_lab's reaper exited with code {self.returncode} before starting {args[0]}")

    def send_signal(self, sig: int) -> None:
        """SIGKILL takes the whole tree (through the reaper, woken first if stopped); other signals reach the child."""
        if sig != signal.SIGKILL:
            return super().send_signal(sig)
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGCONT)  # a stopped reaper could not act on it
                os.kill(self.pid, KILL_TREE)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM to the child; the whole tree SIGKILLed if it has not ended within `timeout` s; the return code."""
        if self.poll() is None:
            self.terminate()
            try:
                return self.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        try:
            return self.wait(30)
        except subprocess.TimeoutExpired:  # a reaper that cannot act: its group, or itself (the child has PDEATHSIG)
            if self.new_session:
                os.killpg(self.pid, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
            return self.wait()

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None:
            self._drop_lifeline()
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._drop_lifeline()
        return code

    def _drop_lifeline(self) -> None:  # the tree is gone: the lifeline has nothing left to guard
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None


def run(args, *, timeout: float | None = None, check: bool = False, capture_output: bool = False, input=None,
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run through `Popen`: the child and what it starts die with this process (or on timeout)."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# ---- the reaper (this file run as a script) ------------------------------------------------------------------------
def _parents() -> dict[int, list[tuple[int, str]]]:
    """{ppid: [(pid, state), ...]} of every process, from /proc/<pid>/stat."""
    kids: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(b")") + 2:].split()[:2]
        kids.setdefault(int(ppid), []).append((int(name), state.decode()))
    return kids


def below(root: int) -> list[tuple[int, str]]:
    """(pid, state) of every process below `root`, by the parent links in /proc."""
    kids, out, todo = _parents(), [], [root]
    while todo:
        for kid in kids.get(todo.pop(), ()):
            out.append(kid)
            todo.append(kid[0])
    return out


def children(pid: int) -> list[int]:
    """The live processes `pid` started, each reaper of this module in between replaced by the child it runs (how a
    test or a benchmark finds serve.py's workers)."""
    out = []
    for kid, state in _parents().get(pid, ()):
        if state in ("Z", "X"):
            continue
        try:
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        out += children(kid) if os.fsencode(_REAPER) in argv[:4] else [kid]
    return out


def _reap() -> list[tuple[int, int]]:
    done = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def _signal_below(me: int, sig: int, seconds: float) -> bool:
    """Send `sig` once to every live process below `me`, and to any that appears, until none is left (True) or
    `seconds` pass (False)."""
    import time

    deadline, sent = time.monotonic() + seconds, set()
    while True:
        live = [pid for pid, state in below(me) if state not in ("Z", "X")]
        if not live:
            return True
        targets = live if sig == signal.SIGKILL else [pid for pid in live if pid not in sent]
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
            sent.add(pid)
        _reap()
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _exit_as(code: int) -> None:
    if code < 0:
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def _reaper(status_fd: int, life_fd: int, grace: float, keep: list[int], cmd: list[str]) -> None:
    import select

    me = os.getpid()
    linux = sys.platform.startswith("linux")
    if linux:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    got: list[int] = []
    for sig in (*FORWARDED, KILL_TREE, signal.SIGCHLD):
        signal.signal(sig, lambda n, _f: got.append(n))
    if life_fd >= 0 and select.select([life_fd], [], [], 0)[0]:
        os._exit(1)  # the parent is gone already

    def pdeathsig() -> None:
        if linux:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(1)
    try:
        child = subprocess.Popen(cmd, pass_fds=keep, preexec_fn=pdeathsig, restore_signals=True)
    except OSError as e:
        os.write(status_fd, f"err {e.errno or 0} {e.strerror or e}\0{e.filename or cmd[0]}\n".encode())
        os._exit(127)
    os.write(status_fd, f"ok {child.pid}\n".encode())
    os.close(status_fd)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in keep:  # the child has its own copies: its pipes close when the child closes them
        os.close(fd)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    code = None
    while code is None:
        ready = select.select([wake_r] + ([life_fd] if life_fd >= 0 else []), [], [])[0]
        if life_fd in ready:  # EOF: the parent process is gone
            _signal_below(me, signal.SIGKILL, 60)
            _exit_as(-signal.SIGKILL)
        try:
            os.read(wake_r, 4096)
        except BlockingIOError:
            pass
        while got:
            sig = got.pop(0)
            if sig == KILL_TREE:
                _signal_below(me, signal.SIGKILL, 60)
                _exit_as(-signal.SIGKILL)
            if sig != signal.SIGCHLD:
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass
        for pid, status in _reap():
            if pid == child.pid:
                code = os.waitstatus_to_exitcode(status)
    if not _signal_below(me, signal.SIGTERM, grace):
        _signal_below(me, signal.SIGKILL, 60)
    _exit_as(code)


if __name__ == "__main__":
    _a = sys.argv[1:]
    _reaper(int(_a[0]), int(_a[1]), float(_a[2]), [int(x) for x in _a[3].split(",") if x], _a[4:])
