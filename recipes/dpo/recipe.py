"""`dpo`: Direct Preference Optimization on pairs made from scored reports.

Answers to one prompt (the same prompt token ids: several rollouts of a request, or a client asking again) that
were reported with different scores make a preference pair: the higher score is chosen, the lower rejected. Each
prompt's answers pair off best with worst, then second best with second worst, while the scores differ by more
than `min_score_gap`; an answer is in at most one pair, and the ones left wait for a partner (at most
`max_waiting` of them, the oldest dropped first). Every `batch_pairs` pairs is one optimizer step on DPO's loss
(recipes/dpo/loss.py) with the frozen base as the reference: the LoRA adapters switched off, or, for a full
fine-tune, a frozen copy of the base model. Sequences are scored at temperature 1 whatever they were sampled at.

The loss is the recipe's own (a reef_lab.trainers.base.SequenceLoss): the torch trainer runs it; a backend that
takes only the built-in losses (slime) is refused when the scenario or experiment is configured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import LearnConfig, require_score
from reef_lab.trainers.samples import Sample
from reef_lab.trainers.base import Trainer, require_sequence_losses
from recipes.dpo.loss import PAIR, ROLE, DPOLoss


@dataclass
class DPOConfig(LearnConfig):
    beta: float = field(default=0.1, metadata={
        "help": "DPO's beta: the strength of the implicit KL tie to the reference (larger: stay closer)"})
    batch_pairs: int = field(default=8, metadata={"client_max": 512, "help": "preference pairs per optimizer step"})
    min_score_gap: float = field(default=0.0, metadata={
        "help": "a pair needs chosen score - rejected score above this (0: any difference)"})
    group_size: int = field(default=4, metadata={"client_max": 64,
        "help": "rollouts per prompt an experiment sends (the recipe pairs answers to the same prompt)"})
    max_waiting: int = field(default=256, metadata={"client_max": 4096,
        "help": "answers kept while they wait for a partner with another score; older ones are dropped"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"beta must be a finite number > 0, got {self.beta}")
        if self.batch_pairs < 1 or self.group_size < 2 or self.max_waiting < 2:
            raise ValueError("batch_pairs must be >= 1, group_size >= 2 (a pair needs two answers to one prompt) "
                             "and max_waiting >= 2")
        if not (self.min_score_gap >= 0 and math.isfinite(self.min_score_gap)):
            raise ValueError(f"min_score_gap must be a finite number >= 0, got {self.min_score_gap}")


def preference_pairs(pool: list[Sample], min_gap: float) -> list[tuple[Sample, Sample]]:
    """(chosen, rejected) pairs of answers to the same prompt, disjoint, oldest first (by their earlier member's
    place in the pool)."""
    order = {id(s): i for i, s in enumerate(pool)}
    by_prompt: dict[tuple[int, ...], list[Sample]] = {}
    for s in pool:
        by_prompt.setdefault(tuple(s.prompt_ids), []).append(s)
    pairs = []
    for answers in by_prompt.values():
        ranked = sorted(answers, key=lambda s: -s.score)  # stable: among equal scores the older first
        while len(ranked) >= 2 and ranked[0].score - ranked[-1].score > min_gap:
            pairs.append((ranked.pop(0), ranked.pop()))
    return sorted(pairs, key=lambda p: min(order[id(p[0])], order[id(p[1])]))


class DPORecipe(WeightRecipe):
    name = "dpo"

    def __init__(self, **config):
        self.config = DPOConfig(**config)
        require_sequence_losses(self.config.trainer, self.name)
        self.loss = DPOLoss(self.config.beta)

    @property
    def rollouts_per_prompt(self) -> int:
        return self.config.group_size

    def validate_report(self, report: dict) -> None:
        require_score(self.name, report)

    def accepts(self, sample: Sample) -> bool:
        return sample.score is not None and math.isfinite(sample.score)

    def ready(self, pool, trainer_step, release_steps) -> bool:
        """A batch of pairs, or too many answers waiting (the round then only drops the oldest)."""
        pairs = preference_pairs(pool, self.config.min_score_gap)
        return len(pairs) >= self.config.batch_pairs or len(pool) - 2 * len(pairs) > self.config.max_waiting

    def build_batch(self, pool, trainer_step, release_steps):
        pairs = preference_pairs(pool, self.config.min_score_gap)
        taken = pairs[: self.config.batch_pairs] if len(pairs) >= self.config.batch_pairs else []
        batch = []
        for k, (chosen, rejected) in enumerate(taken):
            pair = f"{chosen.record_id}>{rejected.record_id}"
            batch += [replace(chosen, extra={**chosen.extra, ROLE: "chosen", PAIR: pair}),
                      replace(rejected, extra={**rejected.extra, ROLE: "rejected", PAIR: pair})]
        used = {s.record_id for s in batch}
        waiting = [s for s in pool if s.record_id not in used]
        dropped = waiting[: max(0, len(waiting) - self.config.max_waiting)]
        return batch, dropped

    def train(self, trainer: Trainer, batch: list[Sample]) -> dict:
        m = trainer.step(batch, self.loss)
        pairs = len(batch) // 2
        gaps = [c.score - r.score for c, r in zip(batch[0::2], batch[1::2], strict=True)]
        return {**m, "policy_step": True, "pairs": pairs, "reward_accuracy": m["correct_sum"] / pairs,
                "margin_mean": m["margin_sum"] / pairs, "chosen_reward_mean": m["chosen_reward_sum"] / pairs,
                "rejected_reward_mean": m["rejected_reward_sum"] / pairs, "score_gap_mean": sum(gaps) / pairs,
                "reward_mean": sum(s.score for s in batch) / len(batch)}
