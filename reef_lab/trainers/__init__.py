"""Trainer backends by name: a recipe config's `trainer.backend` is a short name below or a `module:Class` path of a
reef_lab.trainers.base.Trainer (an operator's choice, never a client's). Each backend validates its own
`trainer.options` (Trainer.check_config)."""

from __future__ import annotations

from pathlib import Path

from reef_lab.plugins import load_class
from reef_lab.trainers.base import Trainer, TrainerConfig

BACKENDS = {"torch": "reef_lab.trainers.torch_trainer:TorchTrainer", "slime": "reef_lab.trainers.slime:SlimeTrainer"}


def trainer_class(spec: str) -> type[Trainer]:
    if spec not in BACKENDS and ":" not in spec:
        raise ValueError(f"trainer backend {spec!r} is neither one of {sorted(BACKENDS)} nor a module:Class path")
    return load_class(spec, Trainer, "trainer backend", names=BACKENDS)


def make_trainer(config: TrainerConfig | dict, model_dir: str | Path, init_folder: str | Path | None) -> Trainer:
    """The trainer a recipe's `trainer` config names, on the base model and a release's weights."""
    cfg = config if isinstance(config, TrainerConfig) else TrainerConfig(**config)
    return trainer_class(cfg.backend)(model_dir, cfg, init_folder)
