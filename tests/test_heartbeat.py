"""Every run writes a heartbeat, and the apps read a run's status from it (reef_lab/learning/heartbeat.py,
apps/shared.py:run_status): a run started from the command line that writes nothing for minutes is running while its
process lives, stopped once it is killed, failed with its error when it raised; a pid the kernel gave to another
process is not taken for the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.shared import run_status
from reef_lab.learning import heartbeat
from reef_lab.learning.heartbeat import Heartbeat

ROOT = Path(__file__).resolve().parents[1]
HOLD = """import sys, time
from reef_lab.learning.heartbeat import Heartbeat
with Heartbeat(sys.argv[1], interval_s=0.2):
    print("holding", flush=True)
    if sys.argv[2] == "fail":
        raise ValueError("the verifier broke")
    time.sleep(120)
"""


def quiet_run(folder: Path) -> list[Path]:
    """A run folder whose files last changed 10 minutes ago (the apps' old rule called such a run stopped)."""
    metrics = folder / "data" / "learn" / "x" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text('{"event": "step"}\n')
    (folder / "config.json").write_text("{}")
    old = time.time() - 600
    for p in (metrics, folder / "config.json"):
        os.utime(p, (old, old))
    return [metrics]


def hold(folder: Path, mode: str = "hold") -> subprocess.Popen:
    """A process that holds a heartbeat on `folder`, as scripts/run_experiment.py does, and prints once it does."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), mode], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
    return proc


def test_a_quiet_command_line_run_is_running_while_alive_and_stopped_once_killed(tmp_path):
    activity = quiet_run(tmp_path)
    assert run_status(tmp_path, False, activity).startswith("stopped")  # no heartbeat: judged by its files
    proc = hold(tmp_path)
    try:
        beat = heartbeat.read(tmp_path)
        assert beat["pid"] == proc.pid and beat["pid_start"] == heartbeat.process_start(proc.pid)
        assert run_status(tmp_path, False, activity) == "running"
        first = beat["beat_at"]
        deadline = time.time() + 60
        while heartbeat.read(tmp_path)["beat_at"] == first:  # the background thread refreshes it
            assert time.time() < deadline, "the heartbeat was not refreshed"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    status = run_status(tmp_path, False, activity)
    assert status.startswith("stopped (last heartbeat "), status


def test_a_run_that_raised_is_failed_with_its_error(tmp_path):
    activity = quiet_run(tmp_path)
    proc = hold(tmp_path, "fail")
    assert proc.wait(timeout=60) != 0
    assert run_status(tmp_path, False, activity) == "failed: ValueError: the verifier broke"
    assert heartbeat.read(tmp_path)["state"] == "failed"


def test_finished_and_interrupted_runs(tmp_path):
    with Heartbeat(tmp_path / "done"):
        assert run_status(tmp_path / "done", False, []) == "running"  # this process, alive
    assert heartbeat.read(tmp_path / "done")["state"] == "finished"
    assert run_status(tmp_path / "done", True, []) == "finished"
    with pytest.raises(KeyboardInterrupt), Heartbeat(tmp_path / "interrupted"):
        raise KeyboardInterrupt
    assert heartbeat.read(tmp_path / "interrupted")["state"] == "stopped"
    assert run_status(tmp_path / "interrupted", False, []).startswith("stopped")


def test_a_reused_pid_is_not_the_run_and_a_foreign_beat_is_judged_by_its_age(tmp_path):
    with Heartbeat(tmp_path):
        beat = heartbeat.read(tmp_path)
    now = time.time()
    # this test's own pid runs, but started at another time than the run that wrote the beat
    reused = {**beat, "state": "running", "pid_start": beat["pid_start"] - 1, "beat_at": now - 600}
    assert not heartbeat.alive(reused)
    (tmp_path / heartbeat.FILE).write_text(json.dumps(reused))
    assert run_status(tmp_path, False, []).startswith("stopped (last heartbeat ")
    assert heartbeat.alive({**reused, "pid_start": beat["pid_start"]})
    # another machine's run (a shared disk): its pid means nothing here; a beat newer than a minute means alive
    foreign = {**reused, "host": "elsewhere", "beat_at": now - 5}
    assert heartbeat.alive(foreign, now) and not heartbeat.alive({**foreign, "beat_at": now - 120}, now)


def test_an_app_launched_run_is_running_before_its_heartbeat_starts(tmp_path):
    """The launcher's run.pid names a process that started before the file was written: running. A pid file older
    than its process (the pid reused since) does not count."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (tmp_path / "run.pid").write_text(f"{proc.pid}\n")
        assert run_status(tmp_path, False, []) == "running"
        old = time.time() - 3600
        os.utime(tmp_path / "run.pid", (old, old))
        assert run_status(tmp_path, False, []).startswith("stopped")
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_every_experiment_writes_its_heartbeat(tmp_path, stub_url):
    """A GEPA experiment (the weight and tttd experiments take the same path: tests/test_experiment.py and
    tests/test_tttd_loop.py check their folders) leaves a finished heartbeat beside its summary."""
    from recipes.gepa.experiment import GEPAExperimentConfig, run_gepa_experiment

    lm = {"kind": "openai", "base_url": stub_url, "model": "stub-model"}
    cfg = GEPAExperimentConfig(name="calc", task={"name": "arithmetic"}, train_size=4, val_size=3, test_size=2,
                               task_lm=lm, reflection_lm=lm, out_dir=str(tmp_path / "run"),
                               search={"max_metric_calls": 12, "minibatch_size": 2})
    run_gepa_experiment(cfg, progress=False)
    beat = heartbeat.read(tmp_path / "run")
    assert beat["state"] == "finished" and beat["pid"] == os.getpid() and beat["ended_at"] >= beat["started_at"]
