"""reef_lab.procs: a child, and whatever it starts in whatever session, dies with the process that started it, kill -9
included; and so do the call sites that start processes (serve.py's workers, the vLLM engine's server, with a
stand-in that starts processes as vLLM does). Each case kills a real parent with SIGKILL and walks /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from reef_lab import procs
from reef_lab.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux's")

# A child that starts a grandchild in a new session and a daemon (double fork: its parent exits, so it is an orphan),
# writes the three pids as JSON to argv[1], then sleeps.
CHILD = textwrap.dedent("""
    import json, os, subprocess, sys, time
    grandchild = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            time.sleep(3600)
        os._exit(0)
    os.wait()
    daemon = int(os.read(r, 64))
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump({"child": os.getpid(), "grandchild": grandchild.pid, "daemon": daemon}, f)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(3600)  # the child
""")


def start_time(pid: int) -> int | None:
    """The process's start time (to tell it from a later one with its pid); None when gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def alive(procs_: dict[str, tuple[int, int]]) -> list[str]:
    return [name for name, (pid, t) in procs_.items() if start_time(pid) == t]


def wait_for_file(path: Path, proc: subprocess.Popen | None = None, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc is None or proc.poll() is None, f"the parent exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{path} was not written"
        time.sleep(0.05)
    return json.loads(path.read_text())


def snapshot(pids: dict[str, int]) -> dict[str, tuple[int, int]]:
    out = {name: (pid, start_time(pid)) for name, pid in pids.items()}
    assert all(t is not None for _, t in out.values()), out
    return out


def gone_within(tree: dict[str, tuple[int, int]], seconds: float) -> list[str]:
    """Waits up to `seconds` for every process of `tree` to end; the names still alive after that."""
    deadline = time.monotonic() + seconds
    while (left := alive(tree)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def cleanup(tree: dict[str, tuple[int, int]]) -> None:
    for name in alive(tree):
        os.kill(tree[name][0], signal.SIGKILL)


def run_parent(code: str, tmp_path: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_a_child_and_what_it_starts_in_other_sessions_die_with_a_parent_killed_9(tmp_path):
    """The child is started from a thread that ends at once (PR_SET_PDEATHSIG alone would kill it then): it lives
    on while the parent does, and on kill -9 of the parent the child, its grandchild in a new session and its
    orphaned daemon are all gone within 5 s."""
    out = tmp_path / "pids.json"
    parent = run_parent(f"""
        import sys, threading, time
        from reef_lab import procs
        threading.Thread(target=lambda: procs.Popen([sys.executable, "-c", {CHILD!r}, {str(out)!r}])).start()
        time.sleep(3600)
    """, tmp_path)
    tree = {}
    try:
        tree = snapshot(wait_for_file(out, parent))
        time.sleep(0.5)
        assert alive(tree) == list(tree), "a child died with the thread that started it"
        parent.kill()
        parent.wait()
        assert gone_within(tree, 5) == []
    finally:
        parent.kill()
        cleanup(tree)


def test_a_child_that_exits_leaves_nothing_behind_and_its_code_passes_through(tmp_path):
    out = tmp_path / "pids.json"
    script = CHILD.replace("time.sleep(3600)  # the child", "sys.stdin.readline()\nsys.exit(3)")
    proc = procs.Popen([sys.executable, "-c", script, str(out)], stdin=subprocess.PIPE, grace=2.0)
    tree = {}
    try:
        tree = snapshot({k: v for k, v in wait_for_file(out).items() if k != "child"})
        proc.stdin.close()  # the child exits
        assert proc.wait(60) == 3
        assert alive(tree) == []  # SIGTERM (then SIGKILL) to what the child left, before the reaper exits
    finally:
        cleanup(tree)
    done = procs.run(["sh", "-c", "echo out; echo err >&2; exit 4"], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err\n")
    assert done.args == ["sh", "-c", "echo out; echo err >&2; exit 4"]
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        procs.Popen(["/no-such-program"])


def test_terminate_reaches_the_child_and_kill_takes_the_whole_tree_even_when_stopped(tmp_path):
    proc = procs.Popen([sys.executable, "-c", "import signal, sys, time\n"
                        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\nprint('up', flush=True)\n"
                        "time.sleep(3600)"], stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"up\n"
    proc.terminate()
    assert proc.wait(30) == 7  # the child's own handler ran: the reaper passed SIGTERM on
    proc.stdout.close()

    out = tmp_path / "pids.json"
    proc = procs.Popen([sys.executable, "-c", CHILD, str(out)])
    tree = {}
    try:
        tree = snapshot(wait_for_file(out))
        os.killpg(proc.pid, signal.SIGSTOP)  # a hung tree, the reaper included
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
        assert gone_within(tree, 5) == []
    finally:
        cleanup(tree)


def test_a_detached_child_outlives_its_launcher_but_nothing_it_starts_outlives_it(tmp_path):
    """experiment.launch_detached's case: the run survives kill -9 of the app that launched it; kill -9 of the run
    takes what the run started (a grandchild in a new session, a daemon)."""
    out = tmp_path / "pids.json"
    launcher = run_parent(f"""
        import sys, time
        from reef_lab import procs
        procs.Popen([sys.executable, "-c", {CHILD!r}, {str(out)!r}], detached=True)
        time.sleep(3600)
    """, tmp_path)
    tree = {}
    try:
        tree = snapshot(wait_for_file(out, launcher))
        launcher.kill()
        launcher.wait()
        time.sleep(1.0)
        assert alive(tree) == list(tree), "a detached run died with its launcher"
        os.kill(tree["child"][0], signal.SIGKILL)
        assert gone_within(tree, 5) == []
    finally:
        launcher.kill()
        cleanup(tree)


def test_launch_detached_writes_the_run_s_own_pid(tmp_path):
    from apps.launch import launch_detached

    proc = launch_detached(tmp_path / "missing.yaml", 0, tmp_path / "run")
    assert int((tmp_path / "run" / "run.pid").read_text()) == proc.child_pid != proc.pid
    assert proc.wait(120) != 0


APP = """
import os, sys
from reef_lab import procs
child = procs.Popen([sys.executable, "-c", {child!r}, {out!r} + str(os.getpid())])

def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
"""


def test_server_workers_and_what_they_start_die_with_the_server_killed_9(tmp_path):
    """server/httpd.py's run() (what serve.py runs) with an app that starts a process tree, as the vLLM engine
    does: kill -9 of the main process takes the worker, the app's child and that child's new-session grandchild and
    daemon. Before reef_lab.procs, a worker of any app but server.wsgi outlived it."""
    (tmp_path / "procs_app.py").write_text(APP.format(child=CHILD, out=str(tmp_path / "pids-")))
    port = free_port()
    parent = run_parent(f"""
        from server import httpd
        httpd.run("procs_app:app", "127.0.0.1", {port}, workers=1)
    """, tmp_path, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    tree = {}
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("pids-*")):
            assert parent.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        found = next(tmp_path.glob("pids-*"))
        worker = int(found.name.removeprefix("pids-"))
        assert procs.children(parent.pid) == [worker]
        tree = snapshot({"worker": worker, **wait_for_file(found)})
        parent.kill()
        parent.wait()
        assert gone_within(tree, 5) == []
    finally:
        parent.kill()
        cleanup(tree)


def test_the_vllm_engine_s_server_and_its_processes_die_with_the_process_that_holds_it(tmp_path, tiny_model_dir):
    """VLLMEngine on a stand-in for vLLM's API server (tests/fixtures/fake_vllm.py: an EngineCore child, whose
    Worker leads a session of its own): kill -9 of the process holding the engine takes all three within 5 s.
    Before reef_lab.procs, the server (started in a session of its own) and everything below it kept running."""
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests/fixtures/fake_vllm.py'} \"$@\"\n")
    wrapper.chmod(0o755)
    pids = tmp_path / "vllm-pids"
    parent = run_parent(f"""
        import time
        from reef_lab.engines.vllm import VLLMEngine
        VLLMEngine({str(tiny_model_dir)!r}, python={str(wrapper)!r}, port={free_port()}, start_timeout=120)
        open({str(tmp_path / 'ready')!r}, "w").close()
        time.sleep(3600)
    """, tmp_path, FAKE_VLLM_PIDS=str(pids))
    tree = {}
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "ready").exists():
            assert parent.poll() is None and time.monotonic() < deadline, "the engine did not start"
            time.sleep(0.1)
        tree = snapshot(dict(zip(("api_server", "engine_core", "worker"), map(int, pids.read_text().split()),
                                 strict=True)))
        parent.kill()
        parent.wait()
        assert gone_within(tree, 5) == []
    finally:
        parent.kill()
        cleanup(tree)
