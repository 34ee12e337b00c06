"""`sft`: supervised fine-tuning on what went well.

Learns from inference records whose report scored at least `score_threshold`, and from demonstrations imported as
`train` records (POST /reef/records/batch with kind "train": request {messages}, response {content}). The loss is
the mean negative log-likelihood of the completion tokens under the model's own distribution (temperature 1), at
whatever temperature a rollout was sampled: the engine applies the serving temperature when it samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import LearnConfig, require_score
from reef_lab.trainers.samples import Sample
from reef_lab.trainers.base import Loss, Trainer


@dataclass
class SFTConfig(LearnConfig):
    score_threshold: float = field(default=1.0, metadata={"help": "train on inferences scored at least this"})
    batch_size: int = field(default=8, metadata={"client_max": 1024, "help": "samples per optimizer step"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


class SFTRecipe(WeightRecipe):
    name = "sft"

    def __init__(self, **config):
        self.config = SFTConfig(**config)

    def validate_report(self, report: dict) -> None:
        require_score(self.name, report)

    def accepts(self, sample: Sample) -> bool:
        return sample.extra.get("demonstration") or (sample.score is not None
                                                     and sample.score >= self.config.score_threshold)

    def ready(self, pool, trainer_step, release_steps) -> bool:
        return len(pool) >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        return pool[: self.config.batch_size], []

    def train(self, trainer: Trainer, batch: list[Sample]) -> dict:
        m = trainer.step(batch, Loss("nll"))
        return {**m, "policy_step": True, "reward_mean": _mean([s.score for s in batch if s.score is not None])}


def _mean(xs):
    return sum(xs) / len(xs) if xs else None
