"""Token losses: what a trainer minimises, as plain tensor functions that tests check by hand.

Tensors are [batch, tokens] over completion tokens, right-padded; `mask` is the loss mask: 1 on the tokens the
model generated, 0 on padding and on what it was given inside an episode (tool results, user turns, template tokens;
reef_lab.trainers.samples). A loss reads nothing at a masked position: not its logprob, not the rollout's logprob,
not its advantage (those may hold anything, even inf), and its gradient there is exactly zero.

- `nll`: SFT's negative log-likelihood of the trained tokens.
- `dis` (decoupled importance sampling with a two-sided token mask; GRPO and SAO): the rollout came from the serving
  engine under a policy pi_rollout whose per-token logprobs the record holds; the trainer's policy pi_theta has moved
  since (asynchrony, staleness, and numeric differences between engine and trainer). The token-level ratio
  rho = pi_theta / pi_rollout corrects the policy gradient; tokens whose ratio leaves [low, high] are dropped (their
  gradient is zero) rather than clipped, so one wild token cannot dominate the update. No KL term, no entropy bonus.
- `is` (TTT-Discover, recipes/tttd): the same ratio, unclipped and unmasked, times the advantage less a KL penalty
  towards the frozen base policy, kl_coef * (log pi_theta - log pi_base) per token.
The advantages come from the recipe (reef_lab.learning.rl computes them) on `Sample.advantages`; they live with the
trainers because every backend computes these losses (torch here, slime's own on GPUs, fed the same advantages).
"""

from __future__ import annotations

import math

from reef_lab.extras import need
from reef_lab.plugins import import_path
from reef_lab.trainers.divergences import TABLE
from reef_lab.trainers.divergences import divergence as divergence_row
from reef_lab.trainers.samples import InvalidSamples

need("train", "the token losses")
import torch


def masked_log_ratio(logp: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log(pi_theta / pi_rollout) on trained tokens and 0 elsewhere, with no gradient path through the masked
    positions' values (a where() over an inf would still send NaN back through exp)."""
    on = mask.bool()
    return torch.where(on, logp, logp.detach()) - torch.where(on, logp_rollout, logp.detach())


def dis_mask(logp: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, low: float,
             high: float) -> torch.Tensor:
    """1 where the token is trained and pi_theta/pi_rollout lies in [low, high], else 0 (no gradient)."""
    ratio = torch.exp(masked_log_ratio(logp.detach(), logp_rollout, mask))
    return (mask.bool() & (ratio >= low) & (ratio <= high)).to(logp.dtype)


def dis_loss(logp: torch.Tensor, logp_rollout: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             low: float, high: float) -> tuple[torch.Tensor, dict]:
    """Sum over kept tokens of -rho * A (divide by the batch's trained-token count for the token mean).

    Returns (loss_sum, stats) with stats holding sums over trained tokens: kept, masked_low, masked_high, ratio.
    """
    keep = dis_mask(logp, logp_rollout, mask, low, high)
    ratio = torch.exp(masked_log_ratio(logp, logp_rollout, mask))
    loss_sum = -(keep * ratio * torch.where(keep.bool(), advantages.detach(), 0.0)).sum()
    real = mask.bool()
    r = ratio.detach()
    stats = {"tokens": float(real.sum()), "kept": float(keep.sum()),
             "masked_low": float((real & (r < low)).sum()), "masked_high": float((real & (r > high)).sum()),
             "ratio_sum": float((r * mask).sum())}
    return loss_sum, stats


def per_token(chunk: list, what: str, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] of each sample's per-token `what` (`advantages`, `base_logprobs` or `teacher_logprobs`: one value per
    completion token),
    0 where the loss mask is 0 (those values are never read, so an episode may leave them None)."""
    out = torch.zeros_like(mask)
    for i, s in enumerate(chunk):
        values = {"advantages": s.advantages, "base_logprobs": s.base_logprobs,
                  "teacher_logprobs": s.teacher_logprobs}[what]
        if values is None:
            raise ValueError(f"sample {s.record_id}: no {what} (the recipe sets Sample.advantages and the teacher's "
                             "logprobs; the trainer fills in base_logprobs when a loss asks for a reference)")
        if len(values) != len(s.completion_ids):
            raise InvalidSamples.of({s.record_id: f"{len(values)} {what} for {len(s.completion_ids)} completion "
                                                  "tokens"})
        row = [float(v) if m else 0.0 for v, m in zip(values, s.mask)]
        out[i, : len(row)] = torch.tensor(row, dtype=out.dtype)
    return out


def nll_loss(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """SFT: the negative log-likelihood summed over trained tokens."""
    return -torch.where(mask.bool(), logp, 0.0).sum(), {}


def dis_token_loss(low: float, high: float):
    """The trainer loss of a DIS policy-gradient step: per-token advantages from each sample's
    `advantages`, the rollout's logprobs as the behaviour policy (shared by grpo and sao)."""
    def loss(logp, batch, chunk):
        adv = per_token(chunk, "advantages", batch["mask"])
        return dis_loss(logp, batch["old_logprobs"], adv, batch["mask"], low, high)
    return loss


def is_loss(logp: torch.Tensor, logp_rollout: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
            logp_base: torch.Tensor | None = None, kl_coef: float = 0.0) -> tuple[torch.Tensor, dict]:
    """TTT-Discover's policy loss: sum over trained tokens of -rho * (A - kl_coef * sg(logp - logp_base)), unclipped.

    rho = exp(logp - logp_rollout) corrects for the rollout coming from the engine's policy; no token is masked or
    clipped. The KL term's gradient, kl_coef * rho * (logp - logp_base) * grad logp, is the importance-weighted
    token-level gradient of KL(pi_theta || pi_base) (the score-function form; its expectation of rho * grad logp is
    zero, so no baseline is needed). Returns (loss_sum, stats) with sums over trained tokens: tokens, ratio_sum and,
    with a base, kl_sum (the k1 estimate logp - logp_base) and kl_k3_sum (exp(d) - 1 - d, d = logp_base - logp).
    """
    on = mask.bool()
    ratio = torch.exp(masked_log_ratio(logp, logp_rollout, mask)) * mask
    shaped = torch.where(on, advantages.detach(), 0.0)
    stats = {"tokens": float(mask.sum()), "ratio_sum": float(ratio.detach().sum())}
    if logp_base is not None:
        log_gap = torch.where(on, logp.detach() - logp_base, 0.0)
        shaped = shaped - kl_coef * log_gap
        stats["kl_sum"] = float(log_gap.sum())
        stats["kl_k3_sum"] = float(((torch.exp(-log_gap) - 1 + log_gap) * mask).sum())
    elif kl_coef:
        raise ValueError("a KL penalty needs the base policy's logprobs")
    return -(ratio * shaped).sum(), stats


def is_token_loss(kl_coef: float):
    """The trainer loss of an `is` step: per-token advantages from `Sample.advantages`, the rollout's logprobs as
    the behaviour policy and, when kl_coef > 0, the base policy's from `Sample.base_logprobs` (the trainer fills
    them in)."""
    def loss(logp, batch, chunk):
        adv = per_token(chunk, "advantages", batch["mask"])
        base = per_token(chunk, "base_logprobs", batch["mask"]) if kl_coef else None
        return is_loss(logp, batch["old_logprobs"], adv, batch["mask"], base, kl_coef)
    return loss


def is_metrics(m: dict) -> dict:
    """An `is` step's counters as per-token means."""
    tokens = m.get("tokens") or 1
    out = {"ratio_mean": m.get("ratio_sum", tokens) / tokens}
    if "kl_sum" in m:
        out |= {"kl_base_mean": m["kl_sum"] / tokens, "kl_base_k3_mean": m["kl_k3_sum"] / tokens}
    return out


def dis_metrics(m: dict) -> dict:
    """A DIS step's counters as fractions of its tokens; none when the trainer did not count them (a backend whose
    loss runs elsewhere, e.g. slime's, reports no per-token mask counts: no fractions are made up for it)."""
    if "kept" not in m:
        return {}
    tokens = m.get("tokens") or 1
    return {"masked_fraction": 1 - m.get("kept", tokens) / tokens,
            "masked_low_fraction": m.get("masked_low", 0) / tokens,
            "masked_high_fraction": m.get("masked_high", 0) / tokens,
            "ratio_mean": m.get("ratio_sum", tokens) / tokens}


# ---- distillation: a teacher's logprobs on the student's own tokens (issue 41) ---------------------------------------
# Which divergences exist, and which function each runs: reef_lab/trainers/divergences.py (the one table).
DIVERGENCES = tuple(TABLE)  # 0.1's name for the built-in ones


def opd_loss(logp: torch.Tensor, logp_teacher: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor,
             is_cap: float) -> tuple[torch.Tensor, dict]:
    """On-policy distillation: the reverse KL(student || teacher) on the tokens the student sampled.

    Per trained token t the teacher scored the student's own token y_t (no new tokens, never re-tokenised text);
    d_t = log pi_s(y_t) - log pi_teacher(y_t) is the one-sample estimate of the reverse KL there, and its gradient
    is E_{y ~ pi_s}[d * grad log pi_s] (the score-function form; E[grad log pi_s] = 0). Tokens sampled by an older
    release mu are reweighted by rho = pi_s / mu, truncated at `is_cap` (no gradient through rho). The loss summed
    is sum_t sg(min(rho_t, is_cap) * d_t) * log pi_s(y_t): its gradient is that estimate, its value is not the KL
    (stats carry the KL: reverse_kl_sum, and how many ratios were capped)."""
    on = mask.bool()
    gap = torch.where(on, logp.detach() - torch.where(on, logp_teacher, 0.0), 0.0)
    raw = torch.exp(masked_log_ratio(logp, logp_rollout, mask)).detach()
    ratio = torch.where(on, raw.clamp(max=is_cap), 0.0)
    loss = (ratio * gap * torch.where(on, logp, 0.0)).sum()
    return loss, {"tokens": float(mask.sum()), "reverse_kl_sum": float(gap.sum()),
                  "ratio_sum": float(ratio.sum()), "capped": float(((raw > is_cap) & on).sum())}


def topk_divergence(logp_student: torch.Tensor, logp_teacher: torch.Tensor, mask: torch.Tensor, kind: str,
                    beta: float = 0.5) -> tuple[torch.Tensor, dict]:
    """A divergence between teacher and student over the teacher's top-K tokens at each trained position.

    `logp_student`, `logp_teacher`: [B, T, K] log-probabilities (under each model's full softmax) of the same K
    token ids, the teacher's most likely ones at that position; both are renormalised over those K (so each is a
    distribution and the divergence is >= 0, 0 when they agree on the K). `forward_kl`: KL(teacher || student),
    mass-covering; `jsd`: the generalised Jensen-Shannon divergence with weight `beta` on the teacher,
    beta KL(t || m) + (1 - beta) KL(s || m), m = beta t + (1 - beta) s (beta 0.5: the symmetric JSD). The teacher
    carries no gradient. Returns (the divergence summed over trained positions, stats)."""
    if kind not in ("forward_kl", "jsd"):
        raise ValueError(f"a top-K divergence is forward_kl or jsd, got {kind!r}")
    if not 0 < beta < 1:
        raise ValueError(f"jsd's beta must be in (0, 1), got {beta}")
    on = mask.bool()
    s = torch.log_softmax(torch.where(on[..., None], logp_student, 0.0), dim=-1)
    t = torch.log_softmax(torch.where(on[..., None], logp_teacher.detach(), 0.0), dim=-1)
    if kind == "forward_kl":
        per = (t.exp() * (t - s)).sum(-1)
    else:
        m = torch.logsumexp(torch.stack([t + math.log(beta), s + math.log(1 - beta)]), dim=0)
        per = beta * (t.exp() * (t - m)).sum(-1) + (1 - beta) * (s.exp() * (s - m)).sum(-1)
    per = torch.where(on, per, 0.0)
    return per.sum(), {"tokens": float(mask.sum()), f"{kind}_sum": float(per.detach().sum())}


def teacher_top(chunk: list, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, T, K] token ids, [B, T, K] logprobs) of the teacher's top-K per completion token, from the samples'
    teacher_top_ids / teacher_top_logprobs; ids 0 and logprobs 0 where the loss mask is 0 (never read)."""
    ks = {len(row) for s in chunk for row, m in zip(s.teacher_top_ids or [], s.mask) if m}
    if any(s.teacher_top_ids is None or s.teacher_top_logprobs is None for s in chunk) or len(ks) != 1:
        raise ValueError("a top-K divergence needs teacher_top_ids and teacher_top_logprobs on every sample, the "
                         f"same K at every trained token (found K in {sorted(ks)})")
    (k,) = ks
    ids = torch.zeros((*mask.shape, k), dtype=torch.long, device=mask.device)
    logp = torch.zeros((*mask.shape, k), dtype=mask.dtype, device=mask.device)
    for i, s in enumerate(chunk):
        if len(s.teacher_top_ids) != len(s.completion_ids) or len(s.teacher_top_logprobs) != len(s.completion_ids):
            raise InvalidSamples.of({s.record_id: f"teacher top-K rows for {len(s.teacher_top_ids)} tokens, "
                                                  f"{len(s.completion_ids)} completion tokens"})
        for t, (row_ids, row_lp, m) in enumerate(zip(s.teacher_top_ids, s.teacher_top_logprobs, s.mask)):
            if m:
                ids[i, t] = torch.tensor(row_ids)
                logp[i, t] = torch.tensor(row_lp, dtype=mask.dtype)
    return ids, logp


def reverse_kl_loss(logp, batch, chunk, *, is_cap: float, jsd_beta: float):
    """The `reverse_kl` row: from Sample.teacher_logprobs (opd_loss)."""
    teacher = per_token(chunk, "teacher_logprobs", batch["mask"])
    return opd_loss(logp, teacher, batch["old_logprobs"], batch["mask"], is_cap)


def forward_kl_loss(logp, batch, chunk, *, is_cap: float, jsd_beta: float):
    """The `forward_kl` row: from the teacher's top-K (the trainer computes the student's logprobs of those ids in
    the same forward pass, batch["student_topk"])."""
    return topk_divergence(batch["student_topk"], batch["teacher_topk"], batch["mask"], "forward_kl")


def jsd_loss(logp, batch, chunk, *, is_cap: float, jsd_beta: float):
    """The `jsd` row, as forward_kl's with the generalised JSD."""
    return topk_divergence(batch["student_topk"], batch["teacher_topk"], batch["mask"], "jsd", jsd_beta)


def distill_token_loss(divergence: str, is_cap: float, jsd_beta: float):
    """The trainer loss of a `distill` step (the trainer runs it at temperature 1): the function the divergence's
    row names (reef_lab/trainers/divergences.py)."""
    # builtin: a row's path comes from code the operator's process imported, never from a client
    fn = import_path(divergence_row(divergence).loss, f"divergence {divergence!r}'s loss", builtin=True)

    def loss(logp, batch, chunk):
        return fn(logp, batch, chunk, is_cap=is_cap, jsd_beta=jsd_beta)
    return loss
