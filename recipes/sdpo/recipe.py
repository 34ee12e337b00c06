"""`sdpo`: self-distillation plus the score, as one policy gradient.

Like GRPO, G rollouts of a prompt form a group and each gets its score minus the group mean (over the group's std)
as its advantage; like SDFT, the student shown the report's words (`feedback`: a string or an object's `context`)
scores the student's own tokens. Each token's advantage is the group advantage plus `distill_coef` times the
self-teacher's log-ratio there, log pi_teacher(y_t) - log pi_rollout(y_t): the words say *which* tokens to change,
the score says whether the answer as a whole was good. The loss is GRPO's DIS loss (token ratio to the rollout's
logprob, tokens outside [dis_low, dis_high] masked). Reports need a score; the words are optional (without them a
rollout learns from its score alone), and longer than `max_context_chars` they are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.learning import rl
from reef_lab.learning.distill import (ContextDistillConfig, ContextTeacher, check_report_context,
                                       teacher_gap)
from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import require_score
from reef_lab.trainers import losses
from reef_lab.trainers.base import DistillTrainer, Loss
from reef_lab.trainers.divergences import divergence
from reef_lab.trainers.samples import Sample


@dataclass
class SDPOConfig(rl.GroupConfig, ContextDistillConfig):
    distill_coef: float = field(default=1.0, metadata={"help": "weight of the self-teacher's token log-ratio in "
                                                       "each token's advantage (0: GRPO)"})
    gap_clip: float = field(default=5.0, metadata={"help": "the token log-ratio is clipped to [-gap_clip, gap_clip]"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.distill_coef < 0 or self.gap_clip <= 0:
            raise ValueError("distill_coef must be >= 0 and gap_clip > 0")
        if divergence(self.divergence).top_k:
            raise ValueError("sdpo's token advantage is the sampled token's log-ratio: its divergence must be one on "
                             f"the sampled token (reverse_kl), not {self.divergence!r} over a top-K")


class SDPORecipe(ContextTeacher, rl.GroupBatches, WeightRecipe):
    name = "sdpo"

    def __init__(self, **config):
        self.config = SDPOConfig(**config)

    @property
    def rollouts_per_prompt(self) -> int:
        return self.config.group_size

    def validate_report(self, report: dict) -> None:
        require_score(self.name, report)
        check_report_context(self.name, report, self.config, required=False)

    def accepts(self, sample: Sample) -> bool:
        return sample.score is not None and sample.logprobs is not None and sample.group is not None

    def train(self, trainer, batch: list[Sample]) -> dict:
        if not isinstance(trainer, DistillTrainer):
            raise ValueError(f"trainer backend {type(trainer).__name__} cannot score a teacher: sdpo needs "
                             "trainer.backend torch")
        worded = [s for s in batch if s.context is not None]
        if worded:
            trainer.score_self(worded, self.teacher_prompts(worded), ema=self.config.teacher_ema)
        advs = rl.group_advantages([s.score for s in batch], [s.group for s in batch],
                                   scale=self.config.scale_by_std)
        clip, coef = self.config.gap_clip, self.config.distill_coef
        for s, a in zip(batch, advs, strict=True):
            if s.teacher_logprobs is None:
                s.advantages = [a] * len(s.completion_ids)
            else:
                s.advantages = [a + coef * max(-clip, min(clip, t - r))
                                for t, r in zip(s.teacher_logprobs, s.logprobs, strict=True)]
        m = trainer.step(batch, Loss("dis", self.config.dis_low, self.config.dis_high))
        return {**m, **losses.dis_metrics(m), **teacher_gap(batch), "policy_step": True, "worded": len(worded),
                "reward_mean": sum(s.score for s in batch) / len(batch)}
