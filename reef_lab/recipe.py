"""The Recipe protocol: how a scenario turns reported traffic into an improvement.

Every recipe checks the reports it is given against its own schema (`validate_report`). A recipe that trains
(`trains = True`) also declares which scored samples it learns from (`accepts`), when it is ready (`ready`), how it
builds a batch from the pool of eligible samples (`build_batch`), how it makes its trainer and takes one training
step (`make_trainer`, `train`); its config (a `LearnConfig` subclass) says how often a step becomes a candidate,
how a candidate is judged (held-out task, selection policy) and when training runs (mode). The learner
(reef_lab/learner.py) drives these hooks; experiments and live traffic share it.

A deployment names its recipe by a `module:Class` path, or by a bare name `x` meaning `recipes.x:Recipe`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from reef_lab.errors import BadRequest
from reef_lab.samples import Sample
from reef_lab.schema import check_fields
from reef_lab.tasks import TaskConfig

MODES = ("auto", "manual", "hybrid")


def _trainer_config():
    from reef_lab.trainers.torch_trainer import TrainerConfig  # torch loads only where a config names a trainer

    return TrainerConfig
SELECTIONS = ("always", "no_regression", "strict_gain", "review")


class Recipe(Protocol):
    name: str
    trains: bool
    config: Any  # its config dataclass (help text per field; `operator` fields are never a client's to set)

    def validate_report(self, report: dict) -> None:
        """Raise BadRequest naming the problem when a report does not fit this recipe's schema."""


class TrainingRecipe(Recipe, Protocol):
    config: LearnConfig

    def accepts(self, sample: Sample) -> bool:
        """Whether a scored sample may join the pool."""

    def ready(self, pool: list[Sample], trainer_step: int, release_steps: dict[str, int]) -> bool:
        """Whether the pool holds a batch."""

    def build_batch(self, pool: list[Sample], trainer_step: int,
                    release_steps: dict[str, int]) -> tuple[list[Sample], list[Sample]]:
        """(batch to train on now, samples to drop for good, e.g. too stale). Both leave the pool."""

    def make_trainer(self, model_dir: Path, init_folder: Path | None) -> Any:
        """The trainer state: needs `.steps` (policy steps taken) and `.export(folder, metadata)`."""

    def train(self, trainer: Any, batch: list[Sample]) -> dict:
        """One training step on the batch; metrics (with `policy_step`: whether the policy's weights moved)."""


@dataclass
class LearnConfig:
    """What every training recipe shares: when it trains, how candidates are made and judged."""

    mode: str = field(default="auto", metadata={
        "help": "auto: train whenever a batch is ready; manual: only on POST /reef/train; hybrid: both"})
    selection: str = field(default="always", metadata={
        "help": "accept a candidate: always, no_regression (held-out accuracy >= serving), strict_gain (>), "
                "or review (wait for POST /reef/scenarios/{s}/promote)"})
    steps_per_candidate: int = field(default=1, metadata={"help": "policy steps between candidates"})
    eval_task: dict | None = field(default=None, metadata={
        "help": "held-out task (reef_lab.tasks.TaskConfig fields) a candidate is scored on; none: no evaluation",
        "schema": TaskConfig})
    eval_size: int = field(default=64, metadata={"help": "held-out items per evaluation"})
    eval_seed: int = field(default=999_983, metadata={"help": "seed of the held-out items (disjoint from training)"})
    eval_max_tokens: int = field(default=32, metadata={"help": "max_tokens of the greedy held-out answers"})
    trainer: dict = field(default_factory=dict, metadata={"help": "reef_lab.trainers.torch_trainer.TrainerConfig",
                                                          "schema": _trainer_config})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.selection in ("no_regression", "strict_gain") and not self.eval_task:
            raise ValueError(f"selection {self.selection!r} compares held-out scores: give an eval_task "
                             "(e.g. {name: arithmetic}) or use selection 'always' or 'review'")
        if self.steps_per_candidate < 1 or self.eval_size < 1:
            raise ValueError("steps_per_candidate and eval_size must be at least 1")


def require_score(recipe_name: str, report: dict) -> None:
    """The report schema of the reward-driven recipes: a report that references inferences carries a score."""
    if report.get("references") and report.get("score") is None:
        raise BadRequest(f"the {recipe_name} recipe needs a 'score' on every report that references inferences")


def select(policy: str, candidate: dict | None, serving: dict | None) -> tuple[str, str]:
    """The selection policy's verdict on a candidate: ("accepted" | "rejected" | "review", reason)."""
    if policy == "always":
        return "accepted", "selection 'always'"
    if policy == "review":
        return "review", "waiting for POST /reef/scenarios/{s}/promote"
    c, s = candidate["accuracy"], serving["accuracy"]
    if policy == "no_regression":
        ok = c >= s
        return ("accepted" if ok else "rejected"), f"held-out {c:.4f} {'>=' if ok else '<'} serving {s:.4f}"
    ok = c > s
    return ("accepted" if ok else "rejected"), f"held-out {c:.4f} {'>' if ok else '<='} serving {s:.4f}"


_FOLDER_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def shipped_recipes() -> list[str]:
    """The recipe folders this installation ships (`recipes/<name>/`): the names any client may choose."""
    spec = importlib.util.find_spec("recipes")
    names = set()
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for p in Path(loc).iterdir():
            if p.is_dir() and _FOLDER_RE.match(p.name) and (p / "__init__.py").is_file():
                names.add(p.name)
    return sorted(names)


class RecipeNotOffered(BadRequest):
    pass


def check_offered(spec: object, offered: set[str]) -> str:
    """`spec` when the deployment offers it; clients never name code of their own (a `module:Class` path runs
    code at import), only the shipped folders and what the operator allowed."""
    if not isinstance(spec, str) or spec not in offered:
        raise RecipeNotOffered(f"recipe {spec!r} is not offered by this deployment; choose one of "
                               f"{sorted(offered)} (the server's operator can allow more with --allowed-recipes)")
    return spec


class RecordOnly:
    """Stands in for a scenario's recipe that cannot be built (a stored name this deployment does not offer, or a
    config it now refuses): the scenario keeps serving and recording, its error shows in /reef/status."""

    trains = False
    config = None

    def __init__(self, error: str):
        self.name, self.error = "record-only", error

    def validate_report(self, report: dict) -> None:
        return None


def recipe_path(spec: str) -> str:
    return spec if ":" in spec else f"recipes.{spec}:Recipe"


def load_recipe(spec: str, config: dict | None = None) -> Recipe:
    path = recipe_path(spec)
    module, _, cls = path.partition(":")
    try:
        klass = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise BadRequest(f"recipe {spec!r} cannot be loaded from {path!r} ({e}); name one of the folders in "
                         "recipes/ or give a module:Class path") from e
    try:
        return klass(**(config or {}))
    except (TypeError, ValueError) as e:
        raise BadRequest(f"recipe {spec!r}: the recipe's config does not fit: {e}") from e
