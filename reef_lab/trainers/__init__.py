"""Trainer backends by name: a recipe config's `trainer.backend` is a short name below or a `module:Class` path of a
reef_lab.trainers.base.Trainer (an operator's choice, never a client's). Each backend validates its own
`trainer.options` (Trainer.check_config)."""

from __future__ import annotations

from pathlib import Path

from reef_lab.plugins import load_class
from reef_lab.trainers.base import Trainer, TrainerConfig

BACKENDS = {"torch": "reef_lab.trainers.torch_trainer:TorchTrainer", "slime": "reef_lab.trainers.slime:SlimeTrainer"}
# Built-in backends that take no options of their own (Trainer.check_config's default): a config naming one without
# options is checked without importing it. Importing the torch trainer imports torch (4 s on a busy 2-core machine,
# 15 s at load 40), which a relay server would pay on the first POST /reef/scenarios of a weights recipe just to
# answer 409; the fuzz test saw that request held past 15 s.
OPTIONLESS = {"torch"}


def check_backend_config(config: TrainerConfig) -> None:
    """The backend's own check of `config` (its options included), resolving the backend by name."""
    if config.backend in OPTIONLESS and not config.options:
        return
    trainer_class(config.backend).check_config(config)


def trainer_class(spec: str) -> type[Trainer]:
    if spec not in BACKENDS and ":" not in spec:
        raise ValueError(f"trainer backend {spec!r} is neither one of {sorted(BACKENDS)} nor a module:Class path")
    return load_class(spec, Trainer, "trainer backend", names=BACKENDS)


def make_trainer(config: TrainerConfig | dict, model_dir: str | Path, init_folder: str | Path | None) -> Trainer:
    """The trainer a recipe's `trainer` config names, on the base model and a release's weights."""
    cfg = config if isinstance(config, TrainerConfig) else TrainerConfig(**config)
    return trainer_class(cfg.backend)(model_dir, cfg, init_folder)
