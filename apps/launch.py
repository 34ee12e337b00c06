"""What the apps do to launch and list runs: a run as a detached child process, YAML override text, the runs a
picker offers. Not an app, and not reef_lab: the apps' own plumbing (`from apps.launch import ...`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from reef_lab.procs import Popen


def launch_detached(config: str | Path, seed: int, out_dir: str | Path, overrides: dict | None = None,
                    root: str | Path | None = None) -> Popen:
    """Start `scripts/run_experiment.py <config> --seed N --out DIR [--set k=v ...]` as a detached child whose
    output goes to `<out_dir>/run.log` and whose pid goes to `<out_dir>/run.pid`: the apps launch runs this way so
    a run outlives the notebook. Each override is written as YAML reads it back (3e-05 as 3.0e-05: YAML takes
    `3e-05` for a string).

    Detached on purpose, unlike every other child reef_lab starts: a run has a budget and ends by itself, it
    resumes where it stopped, and its results are what the user came for, so closing the browser tab or restarting
    the notebook's kernel must not throw away an hour of training; the app finds it again by its folder and pid.
    What the run starts (a vLLM server) dies with the run, `kill -9` included (reef_lab.procs), and
    `kill()` on the handle, or SIGTERM to the pid in run.pid, stops the run and everything below it."""
    root = Path(root) if root else Path(__file__).resolve().parents[1]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(root / "scripts/run_experiment.py"), str(config), "--seed", str(seed),
           "--out", str(out_dir)]
    for key, value in (overrides or {}).items():
        cmd += ["--set", f"{key}={yaml_value(value)}"]
    with open(out_dir / "run.log", "ab") as log:
        proc = Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root, detached=True)
    (out_dir / "run.pid").write_text(f"{proc.child_pid}\n")
    return proc


def yaml_value(value) -> str:
    """`value` as YAML text that reads back as the same value (`--set key=<this>`)."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**9).removesuffix("...\n").strip()


def run_choices(found: list[str], launched: str | None = None) -> list[str]:
    """The folders an app offers, each once: $REEF_LAB_RUN first (how `marimo run apps/<app>.py` is pointed at
    one), then the run this session launched, then those `found` on disk."""
    env = os.environ.get("REEF_LAB_RUN")
    return list(dict.fromkeys(([env] if env else []) + ([launched] if launched else []) + found))
