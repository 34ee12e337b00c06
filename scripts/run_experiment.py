"""Run (or resume) an experiment from a YAML file.

    python scripts/run_experiment.py recipes/sao/examples/arithmetic.yaml

The YAML names its `recipe` (a folder of recipes/ or module:Class) and holds that recipe's experiment fields: the
weight recipes share reef_lab.experiments.weights.ExperimentConfig, gepa has recipes/gepa/experiment.py's
GEPAExperimentConfig (reef_lab.experiments.run: each recipe with its own shape runs it by `Recipe.run_experiment`);
`--set key=value` overrides one (dotted keys reach into
recipe_config/task, values parsed as YAML), `--seed` and `--out` are shortcuts. Progress shows as a bar with the
trainer step, the last batch's reward and the last held-out accuracy; the run folder holds everything (see
reef_lab/experiments/weights.py), and apps/sao.py plots it.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

# Not offline: models load from local folders (local_files_only), and a run with hub.repo pushes its releases.

import yaml  # noqa: E402

from reef_lab.errors import ReefError  # noqa: E402
from reef_lab.experiments import run  # noqa: E402
from reef_lab.learning.recipe import recipe_class  # noqa: E402


def apply_override(d: dict, key: str, value) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="YAML file: recipe and its experiment fields")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
    p.add_argument("--seed", type=int, help="seed (prompts, sampling, trainer)")
    p.add_argument("--out", help="run folder")
    args = p.parse_args(argv)
    data = yaml.safe_load(Path(args.config).read_text()) or {}
    for item in args.set:
        key, _, value = item.partition("=")
        apply_override(data, key, yaml.safe_load(value))
    if args.seed is not None:
        data["seed"] = args.seed
    if args.out:
        data["out_dir"] = args.out
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not isinstance(data.get("recipe"), str):
        p.error(f"{args.config} must name its recipe (recipe: sao, grpo, sft, gepa or module:Class)")
    try:
        recipe_class(data["recipe"])
    except ReefError as e:
        p.error(e.message)
    try:
        summary = run(data)
    except ReefError as e:  # e.g. a candidate failed: the message says what to fix, no summary.json is written
        p.exit(1, f"run_experiment: {e.message}\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
