"""TTT-Discover's core (recipes/tttd) against hand-computed values: the entropic beta and its leave-one-out
advantages, the PUCT archive (scores, selection order, expansion, eviction, JSON resume), the sandbox's limits, the
circle-packing verifier and the scipy baseline, and the config's paper defaults. The `is` loss is in test_rl.py."""

from __future__ import annotations

import math

import pytest

from recipes.tttd import entropic

LN2 = math.log(2)


# --- the entropic objective ------------------------------------------------------------------------------------

def test_entropic_beta_hits_ln2_against_an_independent_solution():
    """Rewards [0, 0, 1]: q_beta puts p = e^b / (2 + e^b) on the best and (1 - p) / 2 on each other, so
    KL(q || uniform) = p ln p + (1 - p) ln((1 - p) / 2) + ln 3. Solve that for p with brentq, then b = ln(2p / (1 - p))."""
    from scipy.optimize import brentq

    def kl_of_p(p):
        return p * math.log(p) + (1 - p) * math.log((1 - p) / 2) + math.log(3)

    p = brentq(lambda p: kl_of_p(p) - LN2, 1 / 3 + 1e-12, 1 - 1e-12, xtol=1e-15)
    beta_by_hand = math.log(2 * p / (1 - p))
    beta = entropic.solve_beta([0.0, 0.0, 1.0])
    assert beta == pytest.approx(beta_by_hand, rel=1e-9)
    assert entropic.kl_to_uniform([0.0, 0.0, 1.0], beta) == pytest.approx(LN2, abs=1e-12)
    # beta * r is what matters: shifting the rewards changes nothing, scaling them by 10 divides beta by 10
    assert entropic.solve_beta([5.0, 5.0, 6.0]) == pytest.approx(beta, rel=1e-9)
    assert entropic.solve_beta([0.0, 0.0, 10.0]) == pytest.approx(beta / 10, rel=1e-9)
    # a longer group, checked the same way (KL at the solution, and monotone in beta around it)
    rs = [0.1, 0.5, 0.52, 0.9, 0.3, 0.9, 0.0, 0.7]
    b = entropic.solve_beta(rs)
    assert entropic.kl_to_uniform(rs, b) == pytest.approx(LN2, abs=1e-10)
    assert entropic.kl_to_uniform(rs, 0.9 * b) < LN2 < entropic.kl_to_uniform(rs, 1.1 * b)


def test_leave_one_out_advantages_by_hand():
    """Rewards [0, 1, 2] at beta = ln 2: exp(beta (r - 2)) = [1/4, 1/2, 1].
    Z_-0 = (1/2 + 1) / 2 = 3/4 -> w = 1/3; Z_-1 = (1/4 + 1) / 2 = 5/8 -> w = 4/5; Z_-2 = (1/4 + 1/2) / 2 = 3/8 -> w = 8/3."""
    adv = entropic.loo_advantages([0.0, 1.0, 2.0], LN2)
    assert adv == pytest.approx([1 / 3 - 1, 4 / 5 - 1, 8 / 3 - 1], rel=1e-12)
    # group_advantages = loo at the solved beta, recomputed here with plain exponentials
    (got, beta) = entropic.group_advantages([0.0, 1.0, 2.0])
    e = [math.exp(beta * (r - 2.0)) for r in (0.0, 1.0, 2.0)]
    by_hand = [e[n] / ((sum(e) - e[n]) / 2) - 1 for n in range(3)]
    assert got == pytest.approx(by_hand, rel=1e-9)
    assert got[2] > 0 > got[1] > got[0]


def test_equal_reward_groups_are_dropped():
    assert entropic.group_advantages([0.5, 0.5, 0.5, 0.5]) is None
    assert entropic.solve_beta([2.0] * 64) is None
    assert entropic.group_advantages([1.0]) is None


def test_unreachable_targets():
    """Two distinct rewards: KL -> ln 2 only as beta -> infinity. The search stops at beta_max and the group is
    refused (the better rollout's weight would be exp(beta_max)). Ties at the max keep the weights finite."""
    assert entropic.kl_supremum([0.0, 1.0]) == pytest.approx(LN2)
    assert entropic.kl_to_uniform([0.0, 1.0], 5.0) < entropic.kl_to_uniform([0.0, 1.0], 10.0) < LN2
    assert entropic.solve_beta([0.0, 1.0]) == entropic.BETA_MAX
    with pytest.raises(ValueError, match="at least 3 rollouts"):
        entropic.group_advantages([0.0, 1.0])
    # [0, 0, 1, 1]: supremum ln(4 / 2) = ln 2, beta = beta_max; Z_-0 = (0 + 1 + 1) / 3 -> A = -1; Z_-2 = 1/3 -> A = 2
    adv, beta = entropic.group_advantages([0.0, 0.0, 1.0, 1.0])
    assert beta == entropic.BETA_MAX
    assert adv == pytest.approx([-1.0, -1.0, 2.0, 2.0], abs=1e-12)
