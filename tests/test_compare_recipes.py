"""scripts/studies/compare_recipes.py as a user runs it: four experiments of three recipes (tiny model, one seed;
context distillation's serving a harness first) in child processes,
then the page: held-out accuracy and the retention task side by side, the command as run, the figure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path: Path, recipe: str, name: str = "", knobs: dict | None = None, **extra) -> Path:
    name = name or f"{recipe}-tiny"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "recipe": recipe, "model_path": "tiny", "rollouts": 8, "concurrency": 4,
        "max_pool": 8, "max_tokens": 4, **extra, "recipe_config": {
            "batch_size": 8, "steps_per_candidate": 1, "eval_task": {"name": "arithmetic"}, "eval_size": 4,
            "eval_max_tokens": 4, "retention_size": 4, "trainer": {"lr": 1.0e-3, "micro_batch_size": 8},
            **({"score_threshold": 0.0} if recipe == "sft" else {}), **(knobs or {})}}))
    return path


@pytest.mark.slow
def test_a_comparison_page_shows_held_out_and_retention_per_recipe(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("The tiny test model: a check of the page, not a result.")
    configs = [config(tmp_path, "sft"), config(tmp_path, "sdft", report_context="The answer is {answer}."),
               config(tmp_path, "sdft", "sdft-topk-tiny", {"divergence": "forward_kl", "top_k": 4},
                      report_context="The answer is {answer}."),
               config(tmp_path, "ctxd", harness={"system_prompt.md": "Answer with the number only."})]
    out = subprocess.run([sys.executable, "scripts/studies/compare_recipes.py", *map(str, configs), "--seeds", "0",
                          "--out", str(tmp_path / "runs"), "--results", str(tmp_path / "page"),
                          "--long-eval-tokens", "0", "--title", "tiny check", "--notes", str(notes)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    page = (tmp_path / "page.md").read_text()
    assert page.startswith("# tiny check") and "a check of the page, not a result" in page
    assert "--title 'tiny check' --notes" in page  # the command line as run
    held, kept = page.split("Retention:")
    assert "| after SFT | 1 |" in held and "| after CTXD | 1 |" in held
    # two configs of one recipe: a row each, named by the config
    assert "| after SDFT (sdft-tiny) | 1 |" in held and "| after SDFT (sdft-topk-tiny) | 1 |" in held
    assert re.search(r"\| base with the run's harness \(served first: the teacher\) \| greedy: one value \| \d\.\d{3} \| "
                     r"\| releases serve without it: \d+ prompt tokens fewer per call \|", held)
    assert re.search(r"\| base \| \d\.\d{3} \|", kept) and "| after SFT |" in kept and "| after SDFT (sdft-topk-tiny) |" in kept
    assert (tmp_path / "page.png").stat().st_size > 10_000
