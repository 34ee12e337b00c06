"""`grpo`: the group baseline, for comparison with SAO at equal rollout budget.

G rollouts of the same prompt form a group (the client tags them: `x-reef-tag-group: <prompt id>`); each rollout's
advantage is its score minus the group mean, over the group's std. The loss is the same DIS loss as SAO's (token
ratio to the engine's recorded logprob, two-sided mask), with no value model, KL term or entropy bonus. Rollouts
older than `max_staleness` policy steps are dropped, as in SAO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.learning import rl
from reef_lab.trainers import losses
from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import LearnConfig, require_score
from reef_lab.trainers.samples import Sample
from reef_lab.trainers.base import Loss, Trainer


@dataclass
class GRPOConfig(rl.GroupConfig, LearnConfig):
    max_staleness: int = field(default=4, metadata={"help": "most policy steps a rollout may lag the trainer"})


class GRPORecipe(rl.GroupBatches, WeightRecipe):
    name = "grpo"

    def __init__(self, **config):
        self.config = GRPOConfig(**config)

    @property
    def rollouts_per_prompt(self) -> int:
        return self.config.group_size

    def validate_report(self, report: dict) -> None:
        require_score(self.name, report)

    def accepts(self, sample: Sample) -> bool:
        return sample.score is not None and sample.logprobs is not None and sample.group is not None

    def build_batch(self, pool, trainer_step, release_steps):
        batch, stale = super().build_batch(pool, trainer_step, release_steps)
        advs = rl.group_advantages([s.score for s in batch], [s.group for s in batch],
                                   scale=self.config.scale_by_std)
        for s, a in zip(batch, advs, strict=True):
            s.advantages = [a] * len(s.completion_ids)
        return batch, stale

    def train(self, trainer: Trainer, batch: list[Sample]) -> dict:
        m = trainer.step(batch, Loss("dis", self.config.dis_low, self.config.dis_high))
        return {**m, **losses.dis_metrics(m), "policy_step": True,
                "reward_mean": sum(s.score for s in batch) / len(batch)}
