"""scripts/studies/distill_tool_task.py as a user runs it, on the tiny model (a check of the plumbing, not a result):
the four arms each take one step per round on whole episodes and release, the teacher's sampled episodes reach the
sft arm through its records, held-out runs are not trained on, and the page and figure are written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_three_arms_at_equal_episodes_with_a_curve_each(tmp_path):
    from reef_lab.engines.embedded import default_cache_dir
    from reef_lab.engines.tiny import tiny_model_dir

    teacher = tiny_model_dir(default_cache_dir())  # the student itself: OPD's divergence starts at zero
    out = subprocess.run([sys.executable, "scripts/studies/distill_tool_task.py", "--model-path", "tiny", "--teacher",
                          str(teacher), "--episodes", "8", "--per-release", "4", "--n", "3", "--max-tokens", "8",
                          "--concurrency", "4", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "page"),
                          "--arms", "opd", "opd-fkl", "sft", "grpo"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads((tmp_path / "page.json").read_text())
    assert set(res["reference"]) == {"teacher", "base"}
    for arm in ("opd", "opd-fkl", "sft", "grpo"):
        run = res["runs"][f"{arm}-s0"]
        assert [p["release"] for p in run["rounds"]] == [f"{arm}-s0:v1", f"{arm}-s0:v2"]
        assert [p["episodes"] for p in run["rounds"]] == [4, 8]
        assert len(run["steps"]) == 2  # one step per round: the held-out episodes (not reported) trained nothing
        assert all(p["calculator"]["n"] == 3 and p["colors"]["n"] == 3 for p in run["rounds"])
    opd = res["runs"]["opd-s0"]["steps"]
    assert abs(opd[0]["reverse_kl"]) < 1e-4 and abs(opd[0]["teacher_gap"]) < 1e-4  # teacher == student at step 1
    fkl = res["runs"]["opd-fkl-s0"]
    assert fkl["recipe_config"]["divergence"] == "forward_kl" and fkl["recipe_config"]["top_k"] == 16
    assert abs(fkl["steps"][0]["loss"]) < 1e-4  # the forward KL over the teacher's top 16, teacher == student
    assert all(s["tokens"] > 0 for s in res["runs"]["sft-s0"]["steps"])  # the teacher's episodes, imported
    assert "teacher_success" in res["runs"]["sft-s0"]
    page = (tmp_path / "page.md").read_text()
    assert "| opd | 0.000 | 0.000 | 0.000 |" in page and f"Command: `{res['command']}`" in page and "**colors** (retention)" in page
    assert (tmp_path / "page.png").stat().st_size > 10_000
    # the same seed again into the same data dir: refused with what to do, not trained on the first run's records
    def again(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "scripts/studies/distill_tool_task.py", "--model-path", "tiny", "--teacher",
                               str(teacher), "--arms", "sft", "--episodes", "8", "--per-release", "4", "--n", "3",
                               "--max-tokens", "8", "--concurrency", "4", "--data-dir", str(tmp_path / "data"),
                               "--out", str(tmp_path / "again"), *extra], cwd=ROOT, capture_output=True, text=True,
                              timeout=1200)

    rerun = again()  # the reference scenarios exist already: used as they are
    assert rerun.returncode != 0 and "seed-0/sft holds an earlier run's records: remove that folder" in rerun.stderr, \
        rerun.stderr[-3000:]
    shutil.rmtree(tmp_path / "data" / "seed-0" / "sft")  # the arm's folder gone, the teacher's samples still there
    rerun = again("--no-reference")
    assert rerun.returncode != 0 and "holds an earlier run's teacher episodes: remove that folder" in rerun.stderr, \
        rerun.stderr[-3000:]
