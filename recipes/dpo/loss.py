"""DPO's loss as a recipe-defined SequenceLoss: the core knows nothing of it (reef_lab.trainers.base).

Direct Preference Optimization (Rafailov et al., 2023, arXiv 2305.18290) on a pair (chosen c, rejected r) of
answers to one prompt: -log sigmoid(beta * ((log pi(c) - log ref(c)) - (log pi(r) - log ref(r)))), where log pi(y)
is the sum of y's token logprobs over the tokens the model generated (the loss mask) and `ref` is the frozen base.
The trainer hands the batch over in pairs (chosen, rejected), never splitting one across micro-batches, and divides
the summed loss by the number of pairs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reef_lab.trainers.samples import Sample
from reef_lab.trainers.base import SequenceLoss

ROLE, PAIR = "dpo_role", "dpo_pair"  # what the recipe writes in each sample's extra


class DPOLoss(SequenceLoss):
    name = "dpo"
    group = 2
    reference = True

    def __init__(self, beta: float):
        self.beta = beta

    def __call__(self, logp: torch.Tensor, mask: torch.Tensor, samples: list[Sample],
                 ref_logp: torch.Tensor) -> tuple[torch.Tensor, dict]:
        for c, r in zip(samples[0::2], samples[1::2], strict=True):
            if (c.extra.get(ROLE), r.extra.get(ROLE)) != ("chosen", "rejected") or c.extra[PAIR] != r.extra[PAIR]:
                raise ValueError(f"DPO needs (chosen, rejected) pairs in order; got {c.record_id} as "
                                 f"{c.extra.get(ROLE)!r} and {r.record_id} as {r.extra.get(ROLE)!r}")
        on = mask.bool()
        policy = torch.where(on, logp, 0.0).sum(dim=-1)
        ref = torch.where(on, ref_logp, 0.0).sum(dim=-1)
        chosen = self.beta * (policy[0::2] - ref[0::2])  # DPO's implicit rewards
        rejected = self.beta * (policy[1::2] - ref[1::2])
        margin = chosen - rejected
        loss = -F.logsigmoid(margin).sum()
        stats = {"margin_sum": float(margin.detach().sum()), "correct_sum": float((margin.detach() > 0).sum()),
                 "chosen_reward_sum": float(chosen.detach().sum()),
                 "rejected_reward_sum": float(rejected.detach().sum())}
        return loss, stats
