"""How much can a harness move a task at all? Score hand-written system prompts on a GEPA experiment's test split.

    python scripts/studies/probe_harness_headroom.py recipes/gepa/examples/arithmetic.yaml \
        "You are a helpful assistant." "Reply with only the final number." ""

Uses the experiment's task, splits (data seed) and task model settings, with `rules.md` empty; prints the test
accuracy of each prompt. If no prompt a person would write moves the score, a search over prompts cannot either,
whatever its reflection model: the task model is the limit.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml  # noqa: E402

from recipes.gepa.experiment import GEPAExperimentConfig, make_splits  # noqa: E402
from recipes.gepa.search import TaskSystem  # noqa: E402
from reef_lab.engines.lm import make_lm  # noqa: E402
from reef_lab.tasks.base import make_task  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a GEPA experiment YAML")
    p.add_argument("prompts", nargs="+", help="system prompts to score")
    args = p.parse_args()
    cfg = GEPAExperimentConfig(**(yaml.safe_load(Path(args.config).read_text()) or {}))
    engine = None
    if cfg.task_lm.get("kind", "engine") == "engine":
        from reef_lab.engines.embedded import EmbeddedEngine
        engine = EmbeddedEngine.from_path(cfg.model_path, max_batch=max(cfg.concurrency, 1))
    try:
        task = make_task({"system_prompt": "", **cfg.task})
        _, _, test = make_splits(task, cfg.train_size, cfg.val_size, cfg.test_size, cfg.data_seed)
        system = TaskSystem(make_lm(cfg.task_lm, engine), cfg.task_max_tokens, cfg.concurrency)
        print(f"| system prompt | test accuracy ({len(test)} items) |\n|---|---|")
        for prompt in args.prompts:
            rollouts = system.run({"system_prompt.md": prompt, "rules.md": ""}, test)
            print(f"| {prompt!r} | {sum(r.score for r in rollouts) / len(rollouts):.3f} |", flush=True)
    finally:
        if engine is not None:
            engine.close()


if __name__ == "__main__":
    main()
