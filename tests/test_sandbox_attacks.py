"""The TTT sandbox against hostile candidate programs: each test is an attack a policy under RL could find, and
passes only if the sandbox (recipes/tttd/sandbox.py) contains it.

What each one tries: killing the process that called `run_python`; reading the server's secrets from
/proc/<pid>/environ; a `fork()` + `setsid()` child that outlives its verdict; forks, threads and a shell; reading
and truncating a file outside its directory, directly, through a symlink, through the stdout/stderr files the
caller reads back, and through /proc (/proc/1/root, /proc/self/root, the parent's root and cwd); connecting to a
TCP server and an abstract unix socket of the host's loopback; writing into the interpreter's site-packages.
Attacks that would harm the machine if they worked (kill(-1), an unbounded fork bomb) are run bounded: a policy
that finds them is caught by the same containment these tests check.

Every test here failed on the sandbox before bubblewrap (commit 5db3e90, run as root): see the commit message.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
from pathlib import Path

import pytest

from recipes.tttd.sandbox import SandboxLimits, run_python

ROOT = Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=30.0, memory_mb=256, output_bytes=64 * 1024)


def attack(code: str, limits: SandboxLimits = LIMITS):
    r = run_python(code, limits)
    assert r.kind in ("ok", "crash", "timeout", "memory", "output", "garbage"), r
    return r


def seen(r) -> str:
    """Everything a verdict hands back to its caller (what a reward, a record or the model's feedback can carry)."""
    return f"{r.stdout}\n{r.detail}"


@pytest.fixture
def secret(tmp_path):
    """A file outside the sandbox holding a secret, and the secret."""
    value = f"TOP-SECRET-{uuid.uuid4().hex}"
    path = tmp_path / "secret.txt"
    path.write_text(value)
    return path, value


def procs_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker`."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker.encode() in (p / "cmdline").read_bytes():
                    found.append(int(p.name))
            except OSError:  # the process ended while we looked
                continue
    return found


@pytest.fixture
def marker():
    """A unique word a candidate puts in its children's command lines; any left at the end are killed."""
    word = f"reef-sandbox-survivor-{uuid.uuid4().hex[:12]}"
    yield word
    for pid in procs_with(word):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


HELPER = """\
import json, sys
from recipes.tttd.sandbox import SandboxLimits, run_python
code, limits = json.loads(sys.stdin.read())
r = run_python(code, SandboxLimits(**limits))
print(json.dumps({"kind": r.kind, "stdout": r.stdout, "detail": r.detail}))
"""


def in_helper(code: str, env: dict | None = None, **limits) -> tuple[int, dict | None]:
    """Run `code` through run_python in a separate process (the 'server' it could attack): (its exit status, the
    verdict it printed or None)."""
    spec = {"cpu_seconds": 5, "wall_seconds": 30.0, "memory_mb": 256, **limits}
    proc = subprocess.run([sys.executable, "-c", HELPER], input=json.dumps([code, spec]), capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          timeout=120)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if proc.returncode == 0 and lines else None


# --- the process that runs the sandbox -----------------------------------------------------------------------------

def test_a_candidate_cannot_kill_the_process_that_verifies_it():
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')\n"
    rc, verdict = in_helper(code)
    assert rc == 0 and verdict is not None, f"the verifying process died (exit status {rc})"


def test_a_candidate_cannot_read_the_servers_environment_or_see_its_processes():
    token = f"reef-token-{uuid.uuid4().hex}"
    code = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "print('pids', len(pids))\n"
        "for p in pids + [str(os.getppid())]:\n"
        "    for f in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            data = open(f'/proc/{p}/{f}', 'rb').read().split(b'\\0')\n"
        "        except OSError as e:\n"
        "            continue\n"
        "        print(p, f, [v.decode(errors='replace') for v in data if b'TOKEN=' in v])\n")
    rc, verdict = in_helper(code, env={"REEF_TOKEN": token, "HF_TOKEN": token})
    assert rc == 0 and verdict["kind"] == "ok", verdict
    assert token not in verdict["stdout"], "the candidate read the server's REEF_TOKEN"
    count = int(verdict["stdout"].split("\n", 1)[0].split()[1])
    assert count <= 3, f"the candidate sees {count} processes: the server's view of the machine"


# --- processes -----------------------------------------------------------------------------------------------------

SURVIVOR = """\
import os, sys
try:
    pid = os.fork()
except OSError as e:
    print('fork refused', e.errno)
else:
    if pid == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])
    print('forked', pid)
"""


@pytest.mark.parametrize("allow_processes", [False, True])
def test_no_process_of_a_candidate_outlives_its_verdict(marker, allow_processes):
    """fork + setsid escapes a kill of the process group; the sandbox must take it down with the verdict, also when
    processes are allowed."""
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=30.0, memory_mb=256, allow_processes=allow_processes)
    attack(SURVIVOR.replace("{marker}", marker), limits)
    deadline = time.time() + 10  # the kernel tears a namespace down asynchronously; a busy machine needs time
    while procs_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert procs_with(marker) == [], "a candidate's child is still running after its verdict"


def test_forks_threads_and_a_shell_are_refused(marker):
    code = (
        "import os, subprocess, threading, time\n"
        "forks = threads = 0\n"
        "for _ in range(32):\n"  # a fork bomb, bounded: the sandbox must stop the first fork
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    forks += 1\n"
        "for _ in range(8):\n"
        "    try:\n"
        "        threading.Thread(target=time.sleep, args=(1,), daemon=True).start()\n"
        "    except RuntimeError:\n"
        "        break\n"
        "    threads += 1\n"
        "try:\n"
        f"    shell = subprocess.run(['sh', '-c', 'echo shell-ran {marker}'], capture_output=True, text=True).stdout\n"
        "except OSError as e:\n"
        "    shell = f'refused {e.errno}'\n"
        "print('forks', forks, 'threads', threads, 'shell', shell.strip())\n")
    r = attack(code)
    assert r.kind == "ok", r
    assert r.stdout.startswith("forks 0 threads 0 shell refused"), r.stdout


# --- files ---------------------------------------------------------------------------------------------------------

def test_files_outside_the_sandbox_can_be_neither_read_nor_truncated(secret):
    path, value = secret
    code = (f"p = {str(path)!r}\n"
            "try:\n    print(open(p).read())\nexcept OSError as e:\n    print('read refused', e.errno)\n"
            "try:\n    open(p, 'w').close()\n    print('truncated')\nexcept OSError as e:\n"
            "    print('truncate refused', e.errno)\n")
    r = attack(code)
    assert r.kind == "ok", r
    assert value not in seen(r) and "truncated" not in r.stdout
    assert path.read_text() == value


def test_a_symlink_in_the_sandbox_leads_nowhere_outside(secret):
    path, value = secret
    code = (f"import os\np = {str(path)!r}\n"
            "os.symlink(p, 'link')\n"
            "try:\n    print(open('link').read())\nexcept OSError as e:\n    print('read refused', e.errno)\n"
            "try:\n    open('link', 'w').write('pwned')\n    print('written')\nexcept OSError as e:\n"
            "    print('write refused', e.errno)\n")
    r = attack(code)
    assert r.kind == "ok", r
    assert value not in seen(r) and "written" not in r.stdout
    assert path.read_text() == value


def test_the_caller_never_reads_a_file_the_candidate_points_it_at(secret):
    """The old sandbox kept stdout and stderr in the candidate's own directory and read them back by name: a
    candidate that replaced them with symlinks had the caller read any file into the verdict (and the model's
    feedback)."""
    path, value = secret
    code = (f"import os\np = {str(path)!r}\n"
            "for name in ('stdout', 'stderr'):\n"
            "    try:\n        os.remove(name)\n    except OSError:\n        pass\n"
            "    os.symlink(p, name)\n"
            "raise SystemExit(1)\n")
    r = attack(code)
    assert value not in seen(r), "the verdict holds a file outside the sandbox"
    assert path.read_text() == value


def test_proc_leads_nowhere_outside(secret):
    path, value = secret
    code = (f"import os\np = {str(path)!r}\n"
            "for base in ('/proc/1/root', '/proc/self/root', f'/proc/{os.getppid()}/root',"
            " f'/proc/{os.getppid()}/cwd/../../../../../../..', '/proc/self/cwd/../../../../../../..'):\n"
            "    try:\n"
            "        print(base, open(base + p).read())\n"
            "    except OSError as e:\n"
            "        print(base, 'refused', e.errno)\n")
    r = attack(code)
    assert r.kind == "ok", r
    assert value not in seen(r), "the candidate read a file outside the sandbox through /proc"


def test_the_system_and_the_interpreter_are_read_only():
    """The old sandbox ran as the server's user: as root it could plant a module in site-packages that every later
    run (and the server's next start) imports."""
    planted = Path(sysconfig.get_paths()["purelib"]) / f"reef_sandbox_probe_{uuid.uuid4().hex[:8]}.py"
    code = (f"try:\n    open({str(planted)!r}, 'w').write('print(1)')\n    print('planted')\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    try:
        r = attack(code)
        assert r.kind == "ok" and "planted" not in r.stdout, r
        assert not planted.exists()
    finally:
        planted.unlink(missing_ok=True)


def test_the_candidate_may_write_its_own_directory():
    """Not an attack: scratch files in its own directory still work (and vanish with it)."""
    r = attack("open('scratch.txt', 'w').write('42')\nprint(open('scratch.txt').read())\n")
    assert r.kind == "ok" and r.stdout == "42\n", r


# --- the kernel's settings and the candidate's privileges ---------------------------------------------------------

# Opens every file of /proc/sys and of /proc's other global folders for writing and closes it at once, without
# writing a byte: on a sandbox that let it, the host's settings stay as they were.
KERNEL_KNOBS = """\
import errno, os, socket
opened, refused = [], set()
for top in ('/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs', '/proc/driver', '/proc/tty'):
    paths = [top] if not os.path.isdir(top) else [os.path.join(r, f) for r, _, fs in os.walk(top) for f in fs]
    for p in paths:
        try:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            refused.add(errno.errorcode[e.errno])
            continue
        os.close(fd)
        opened.append(p)
try:
    socket.sethostname('pwned')
    opened.append('sethostname')
except OSError as e:
    refused.add(errno.errorcode[e.errno])
print(len(opened), sorted(refused), *opened[:20])
"""


def test_a_candidate_cannot_open_a_kernel_setting_for_writing():
    """Issue 38: run as root, bubblewrap mapped the candidate's uid to root outside and left /proc/sys writable, so a
    candidate could set kernel.core_pattern (a program the kernel runs as root at the next crash), vm.drop_caches,
    user.max_user_namespaces, ... (765 files of /proc/sys opened for writing here)."""
    r = attack(KERNEL_KNOBS, SandboxLimits(cpu_seconds=20, wall_seconds=60.0, memory_mb=256, output_bytes=64 * 1024))
    assert r.kind == "ok", r
    count, *rest = r.stdout.split(maxsplit=1)
    assert count == "0", f"the candidate opened {count} kernel settings for writing: {r.stdout[:2000]}"
    assert "/proc/sys/kernel/core_pattern" not in r.stdout


PRIVILEGES = """\
import ctypes, json, os, time
ctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)  # PR_SET_NAME: the test finds this process from the host by it
status = dict(line.split(':', 1) for line in open('/proc/self/status'))
print(json.dumps({"ids": [*os.getresuid(), *os.getresgid()], "groups": os.getgroups(),
                  "uid_map": open('/proc/self/uid_map').read(),
                  "caps": {k: int(status[k], 16) for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')},
                  "no_new_privs": int(status['NoNewPrivs'])}))
time.sleep(5)
"""


def host_ids(name: str) -> list[str] | None:
    """The real, effective, saved and filesystem uids and gids of the host process called `name`, as the host sees
    them (the candidate's own /proc/self/uid_map names only the namespace one level up)."""
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().strip() == name:
                lines = (p / "status").read_text().splitlines()
                return [v for line in lines if line.startswith(("Uid:", "Gid:")) for v in line.split()[1:]]
        except OSError:  # the process ended while we looked
            continue
    return None


def test_the_candidate_is_an_unprivileged_user_inside_and_outside():
    """Issue 38: run as root, the candidate was uid 65534 inside and root outside (uid_map `65534 0 1`). Now it is
    nobody with no capability inside, and outside it is nobody (a root server) or the server's own user."""
    name = f"reef{uuid.uuid4().hex[:10]}"
    verdict = []
    t = threading.Thread(target=lambda: verdict.append(attack(PRIVILEGES.replace("{name}", name))))
    t.start()
    outside = None
    while outside is None and t.is_alive():
        outside = host_ids(name)
        time.sleep(0.05)
    t.join()
    r = verdict[0]
    assert r.kind == "ok", r
    got = json.loads(r.stdout)
    assert got["ids"] == [65534] * 6 and set(got["groups"]) <= {65534}, got
    assert got["caps"] == dict.fromkeys(got["caps"], 0) and got["no_new_privs"] == 1, got
    server = os.geteuid()
    assert outside == [str(65534 if server == 0 else server)] * 4 + [str(65534 if server == 0 else os.getegid())] * 4, \
        (outside, got["uid_map"])


def test_no_new_user_namespace_even_where_processes_are_allowed():
    """A user namespace of its own would give the candidate capabilities there (mounting an unbounded tmpfs, for
    one): refused by clone's flags, clone3 (whose flags seccomp cannot read) and unshare. Started as root the sandbox
    has no user namespace whose settings could refuse it (bubblewrap's --disable-userns): without the filter's
    check of clone's flags the clone here made one."""
    code = ("import ctypes, errno, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "for name, nr, flags in (('clone', 56, 0x10000000 | 17), ('unshare', 272, 0x10000000)):\n"
            "    ret = libc.syscall(nr, flags, 0, 0, 0, 0)\n"
            "    if ret == 0 and name == 'clone':\n"
            "        os._exit(0)\n"
            "    if ret > 0:\n"
            "        os.waitpid(ret, 0)\n"
            "    print(name, 'made one' if ret >= 0 else errno.errorcode[ctypes.get_errno()])\n"
            "libc.syscall(435, 0, 0)\n"  # clone3 without arguments: EINVAL from the kernel, ENOSYS from the filter
            "print('clone3', errno.errorcode[ctypes.get_errno()])\n"
            "import threading\n"  # threads and forks still work (glibc falls back to clone)
            "t = threading.Thread(target=print, args=('thread ran',))\n"
            "t.start()\n"
            "t.join()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(7)\n"
            "print('fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n")
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall numbers in this test are x86_64's")
    r = attack(code, SandboxLimits(cpu_seconds=5, wall_seconds=30.0, memory_mb=256, allow_processes=True))
    assert r.kind == "ok", r
    assert "made one" not in r.stdout and "clone3 ENOSYS" in r.stdout, r.stdout
    assert r.stdout.endswith("thread ran\nfork 7\n"), r.stdout


# --- disk ----------------------------------------------------------------------------------------------------------

FILL = """\
import errno, os
for top in ('/tmp', '/dev/shm', '/', '/dev'):
    written, why = 0, 'none'
    try:
        for i in range(100):  # 100 files of 60 KB (each under the output cap, which bounds any one file)
            with open(os.path.join(top, f'fill-{i}'), 'wb') as f:
                f.write(b'x' * 60 * 1024)
            written += 60 * 1024
    except OSError as e:
        why = errno.errorcode[e.errno]
    print(top, written, why)
"""


def test_every_writable_mount_is_bounded():
    """Issue 38: /, /dev and /dev/shm were tmpfs of half the RAM (64 MB written in 0.07 s): now /tmp and /dev/shm
    hold `disk_mb` each and the rest is read-only."""
    r = attack(FILL, SandboxLimits(cpu_seconds=10, wall_seconds=60.0, memory_mb=256, output_bytes=64 * 1024, disk_mb=2))
    assert r.kind == "ok", r
    got = {top: (int(n), why) for top, n, why in (line.split() for line in r.stdout.splitlines())}
    assert set(got) == {"/tmp", "/dev/shm", "/", "/dev"}, r.stdout
    for top, (written, why) in got.items():
        assert why in ("ENOSPC", "EROFS", "EACCES") and written <= 2 << 20, (top, written, why)
    assert got["/tmp"][1] == got["/dev/shm"][1] == "ENOSPC" and got["/tmp"][0] > 0, got


MEMORY_ELSEWHERE = """\
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def refused(nr, *args):
    r = libc.syscall(nr, *args)
    return errno.errorcode.get(ctypes.get_errno(), '?') if r == -1 else f'allowed {r}'
nrs = {'x86_64': (319, 29, 68), 'aarch64': (279, 194, 186)}[os.uname().machine]
print('memfd_create', refused(nrs[0], b'm', 0))
print('shmget', refused(nrs[1], 0, 1 << 20, 0o1600))
print('msgget', refused(nrs[2], 0, 0o1600))
opened = []
try:
    for i in range(1000):
        opened.append(open('/tmp/f%d' % i, 'wb'))
    print('files', len(opened), 'none')
except OSError as e:
    print('files', len(opened), errno.errorcode[e.errno])
"""


def test_no_memory_outside_the_limits_memfd_sysv_or_many_files():
    """Memory outside RLIMIT_AS and the bounded mounts: a memfd (bounded only by the output cap times the open-file
    limit), SysV shared memory and message queues are refused; at most 64 files are open at once."""
    r = attack(MEMORY_ELSEWHERE, SandboxLimits(cpu_seconds=10, wall_seconds=60.0, memory_mb=256, disk_mb=2))
    assert r.kind == "ok", r
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert got["memfd_create"] == got["shmget"] == got["msgget"] == "EPERM", got
    count, why = got["files"].split()
    assert why == "EMFILE" and int(count) < 64, got


def test_a_candidate_that_fills_its_disk_scores_zero_with_the_error_kept():
    from recipes.tttd.problems import make_problem

    with pytest.raises(ValueError, match="disk_mb must be >= 1"):
        make_problem({"disk_mb": 0})
    problem = make_problem({"n": 2, "disk_mb": 1, "output_kb": 64, "wall_seconds": 60.0})
    assert problem.limits.disk_mb == 1
    code = ("for i in range(100):\n"
            "    open(f'/tmp/fill-{i}', 'wb').write(b'x' * 60 * 1024)\n"
            + problem.initial_solution())
    v = problem.verify(f"```python\n{code}\n```")
    assert (v.reward, v.valid, v.kind) == (0.0, False, "crash"), v
    assert "No space left on device" in v.reason, v.reason


EMPTY_FILES = """\
import errno, os
for top in ('/tmp', '/dev/shm'):
    made, why = 0, 'none'
    try:
        for i in range(100_000):
            os.close(os.open(os.path.join(top, f'e{i}'), os.O_CREAT | os.O_WRONLY, 0o600))
            made += 1
    except OSError as e:
        why = errno.errorcode[e.errno]
    print(top, made, why)
"""


def test_a_candidate_making_empty_files_hits_the_inode_bound():
    """Issue 50 item 9: a tmpfs's size bounds its blocks, not its inodes: a candidate creating empty files pinned
    about 300 MB of kernel memory (this test made 100,000 in each writable folder). Now each holds `disk_inodes`
    files and folders at most (ENOSPC past it), and a candidate that hits it scores 0 with the error kept."""
    from recipes.tttd.problems import make_problem

    r = attack(EMPTY_FILES, SandboxLimits(cpu_seconds=10, wall_seconds=60.0, memory_mb=256))
    assert r.kind == "ok", r
    got = {top: (int(n), why) for top, n, why in (line.split() for line in r.stdout.splitlines())}
    assert set(got) == {"/tmp", "/dev/shm"}, r.stdout
    for top, (made, why) in got.items():
        assert why == "ENOSPC" and 0 < made < SandboxLimits().disk_inodes <= 10_000, (top, made, why)

    with pytest.raises(ValueError, match="disk_inodes must be >= 16"):
        make_problem({"disk_inodes": 15})
    problem = make_problem({"n": 2, "disk_inodes": 64, "wall_seconds": 60.0})
    assert problem.limits.disk_inodes == 64
    code = "for i in range(100_000):\n    open(f'/tmp/e{i}', 'wb').close()\n" + problem.initial_solution()
    v = problem.verify(f"```python\n{code}\n```")
    assert (v.reward, v.valid, v.kind) == (0.0, False, "crash"), v
    assert "No space left on device" in v.reason, v.reason


# --- network -------------------------------------------------------------------------------------------------------

def test_a_candidate_cannot_reach_the_hosts_loopback():
    got = []
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract = f"\0reef-sandbox-test-{uuid.uuid4().hex[:8]}"
    unix.bind(abstract)
    unix.listen()
    tcp.settimeout(0.2)
    unix.settimeout(0.2)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            for srv in (tcp, unix):
                try:
                    conn, _ = srv.accept()
                except OSError:  # timeout: nobody came
                    continue
                conn.settimeout(2)
                try:
                    got.append(conn.recv(100))
                except OSError:
                    got.append(b"(connected)")
                conn.close()
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    port = tcp.getsockname()[1]
    code = ("import socket\n"
            f"for family, addr in ((socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, {abstract!r})):\n"
            "    s = socket.socket(family, socket.SOCK_STREAM)\n"
            "    s.settimeout(3)\n"
            "    try:\n"
            "        s.connect(addr)\n"
            "        s.sendall(b'pwned')\n"
            "        print('connected', family)\n"
            "    except OSError as e:\n"
            "        print('refused', family, e.errno)\n"
            "    s.close()\n")
    try:
        r = attack(code)
        time.sleep(0.5)  # let the accept thread take anything that did connect
    finally:
        stop.set()
        t.join(5)
        tcp.close()
        unix.close()
    assert r.kind == "ok", r
    assert got == [] and "connected" not in r.stdout, (got, r.stdout)


# --- where bubblewrap cannot run ----------------------------------------------------------------------------------

@pytest.fixture
def no_bwrap(monkeypatch):
    """This process sees bubblewrap as `how`: None (not installed) or a program that fails as bwrap would."""
    from recipes.tttd import sandbox

    def set_to(how):
        monkeypatch.setattr(sandbox, "_bwrap", lambda: (how, (0, 8, 0)) if how else (None, ()))
        sandbox._probe.cache_clear()
    yield set_to
    sandbox._probe.cache_clear()


@pytest.mark.parametrize("how", [None, "/bin/false"])
def test_a_machine_that_cannot_sandbox_fails_at_start_naming_the_fix(no_bwrap, tmp_path, capsys, how):
    from recipes.tttd.problems import CirclePacking, make_problem
    from recipes.tttd.sandbox import SandboxUnavailable
    from reef_lab.config import parse_serve_config

    no_bwrap(how)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap.*sandbox: none"):
        CirclePacking(6)
    with pytest.raises(SystemExit):  # the server does not start
        parse_serve_config(["--recipe", "tttd", "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert "apt-get install bubblewrap" in err and ("not installed" in err) == (how is None), err
    # the centres problem runs no code: it needs no sandbox
    assert make_problem({"name": "circle_centres"}).n == 6


def test_without_isolation_only_by_the_operators_choice_and_logged(no_bwrap, tmp_path, caplog):
    from recipes.tttd import sandbox
    from recipes.tttd.problems import make_problem
    from reef_lab.config import parse_serve_config

    no_bwrap(None)
    sandbox._warn_unisolated.cache_clear()
    cfg = parse_serve_config(["--recipe", "tttd", "--recipe-config", "{problem: {sandbox: none}}",
                              "--data-dir", str(tmp_path)])
    assert cfg.recipe_settings()["problem"] == {"sandbox": "none"}
    assert "candidate programs run as this server's user" in caplog.text
    p = make_problem({"sandbox": "none", "n": 2})
    assert p.verify(f"```python\n{p.initial_solution()}\n```").valid  # candidates still run, with the limits
    r = run_python("while True:\n    pass\n", SandboxLimits(cpu_seconds=1, wall_seconds=60.0, isolation="none"))
    assert r.kind == "timeout"
