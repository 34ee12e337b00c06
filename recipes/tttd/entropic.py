"""TTT-Discover's entropic objective: per-group advantages that chase the group's best rollout.

Why: a discovery run wants one great solution, not a good average, so TTT-Discover (arXiv 2601.16175) maximises
the entropic utility log E[exp(beta * R)] of each group's rewards instead of E[R]. Its gradient weights a rollout by
w_n = exp(beta r_n) / E[exp(beta r)], i.e. advantage A_n = w_n - 1. beta is set per group so that the tilted
distribution q_beta(n) = exp(beta r_n) / sum_m exp(beta r_m) over the group's N rollouts sits at a fixed distance from
uniform: KL(q_beta || uniform) = ln 2 (solved by bisection; the KL grows monotonically with beta). The normaliser is
taken leave-one-out, Z_{-n} = mean over m != n of exp(beta r_m), so a single outlier is not damped by its own weight.
Every exponent is shifted by the group's max reward (exp(beta (r - r_max)) <= 1), which leaves w unchanged.

A group whose rewards are all equal carries no signal and is dropped (`group_advantages` returns None).

Run the hand-checked tests: `python -m pytest tests/test_tttd_core.py -q -k entropic`.
"""

from __future__ import annotations

import math

KL_TARGET = math.log(2.0)
BETA_MAX = 1e6  # the authors' code caps its doubling search here


def _check(rewards: list[float]) -> list[float]:
    rs = [float(r) for r in rewards]
    if not rs:
        raise ValueError("a group needs at least one reward")
    if not all(math.isfinite(r) for r in rs):
        raise ValueError(f"rewards must be finite, got {rs}")
    return rs


def _logsumexp(xs: list[float]) -> float:
    top = max(xs)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(x - top) for x in xs))


def kl_to_uniform(rewards: list[float], beta: float) -> float:
    """KL(q_beta || uniform) for q_beta(n) proportional to exp(beta * r_n) over the group's N rollouts, in nats."""
    rs = _check(rewards)
    top = max(rs)
    logits = [beta * (r - top) for r in rs]
    log_z = _logsumexp(logits)
    log_n = math.log(len(rs))
    kl = 0.0
    for z in logits:
        log_q = z - log_z
        if log_q > -745.0:  # exp underflows to 0 below this; q log q -> 0
            kl += math.exp(log_q) * (log_q + log_n)
    return max(kl, 0.0)


def kl_supremum(rewards: list[float]) -> float:
    """The KL reached as beta -> infinity: q_beta becomes uniform over the k rollouts tied at the max, so
    KL -> ln(N / k). A target at or above this is never reached by a finite beta."""
    rs = _check(rewards)
    top = max(rs)
    return math.log(len(rs) / sum(1 for r in rs if r == top))


def solve_beta(rewards: list[float], target: float = KL_TARGET, beta_max: float = BETA_MAX,
               rel_tol: float = 1e-12) -> float | None:
    """The beta >= 0 with KL(q_beta || uniform) = target, by bisection.

    None when every reward is equal (q_beta is uniform for every beta: the group says nothing). When the target is
    unreachable (it is >= ln(N / k), k the number of rollouts tied at the max, e.g. two distinct rewards and ln 2),
    the KL only approaches its supremum and beta_max is returned, as the authors' code does; `loo_advantages` stays
    finite there for groups of three or more.
    """
    rs = _check(rewards)
    if target <= 0:
        raise ValueError(f"the KL target must be > 0, got {target}")
    if max(rs) == min(rs):
        return None
    if target >= kl_supremum(rs):  # decided exactly here: in floats the KL reaches ln(N / k) near beta ~ 40 / gap
        return beta_max
    lo, hi = 0.0, 1.0
    while kl_to_uniform(rs, hi) < target:
        if hi >= beta_max:
            return beta_max
        lo, hi = hi, min(2.0 * hi, beta_max)
    for _ in range(200):  # the bracket halves each time; 200 halvings reach any float tolerance
        mid = 0.5 * (lo + hi)
        if kl_to_uniform(rs, mid) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo <= rel_tol * hi:
            break
    return 0.5 * (lo + hi)


def loo_advantages(rewards: list[float], beta: float) -> list[float]:
    """A_n = exp(beta (r_n - r_max)) / Z_{-n} - 1 with Z_{-n} = (1 / (N - 1)) sum_{m != n} exp(beta (r_m - r_max)),
    computed in log space so no exponent overflows."""
    rs = _check(rewards)
    if len(rs) < 2:
        raise ValueError("leave-one-out advantages need at least two rollouts in the group")
    if not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be finite and >= 0, got {beta}")
    top = max(rs)
    logits = [beta * (r - top) for r in rs]
    out = []
    for n, z in enumerate(logits):
        log_z_rest = _logsumexp(logits[:n] + logits[n + 1:]) - math.log(len(rs) - 1)
        out.append(math.exp(z - log_z_rest) - 1.0)
    return out


def group_advantages(rewards: list[float], target: float = KL_TARGET,
                     beta_max: float = BETA_MAX) -> tuple[list[float], float] | None:
    """(advantages, beta) of one group, or None when its rewards are all equal (the group is dropped).

    Refused when the target is unreachable and one rollout alone holds the max (two distinct rewards and ln 2 is
    the usual case): beta runs to beta_max and that rollout's leave-one-out weight exp(beta * gap) overflows. Use
    three or more rollouts per group."""
    rs = _check(rewards)
    beta = solve_beta(rs, target, beta_max)
    if beta is None:
        return None
    if target >= kl_supremum(rs) and rs.count(max(rs)) == 1:
        raise ValueError(f"a KL target of {target:.4f} is never reached by {len(rs)} rewards with one maximum "
                         f"(supremum ln(N) = {kl_supremum(rs):.4f}); the best rollout's weight would grow without "
                         "bound: use at least 3 rollouts per group")
    return loo_advantages(rs, beta), beta
