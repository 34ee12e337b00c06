"""The training arithmetic against hand-computed values: GAE (both lambdas), the DIS mask and loss, GRPO's group
baseline, the staleness bound and how SAO's batch builder applies it."""

from __future__ import annotations

import math

import pytest
import torch

from reef_lab.learning import rl
from reef_lab.learning.samples import Sample
from recipes.sao.recipe import SAORecipe, advantages_and_targets

R = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
V = torch.tensor([[0.5, 0.6, 0.8], [0.3, 0.4, 0.0]])
M = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_gae_lambda_one_is_return_minus_value():
    adv = rl.gae(R, V, M, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0.5, 0.4, 0.2], [0.7, 0.6, 0.0]]))
    # value targets with lambda 1: A + V = the Monte-Carlo return (the final score) on every real token
    assert torch.allclose((adv + V) * M, torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))


def test_gae_lambda_half_by_hand():
    # deltas row 0: 0.1, 0.2, 0.2 -> A2 = 0.2, A1 = 0.2 + 0.5*0.2 = 0.3, A0 = 0.1 + 0.5*0.3 = 0.25
    adv = rl.gae(R[:1], V[:1], M[:1], gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.25, 0.3, 0.2]]))


def test_length_adaptive_lambda_by_hand():
    lam = rl.length_adaptive_lambda(torch.tensor([3.0, 2.0]), alpha=1.5)
    assert torch.allclose(lam, torch.tensor([1 - 1 / 4.5, 1 - 1 / 3.0]))
    adv = rl.gae(R, V, M, gamma=1.0, lam=lam)
    l0, l1 = 1 - 1 / 4.5, 1 - 1 / 3.0
    a01 = 0.2 + l0 * 0.2
    expected = torch.tensor([[0.1 + l0 * a01, a01, 0.2], [0.1 + l1 * 0.6, 0.6, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert rl.length_adaptive_lambda(torch.tensor([1.0]), 1.5).item() == pytest.approx(1 / 3)


def test_terminal_rewards_on_last_real_token():
    r = rl.terminal_rewards(torch.tensor([1.0, 0.5]), M)
    assert torch.equal(r, torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]))


def test_dis_mask_and_loss_by_hand():
    ratios = torch.tensor([[0.2, 1.0, 6.0, 0.4, 0.35, 4.9]])
    old = torch.full((1, 6), math.log(0.5))
    logp = (old + ratios.log()).clone().requires_grad_(True)
    mask = torch.ones(1, 6)
    keep = rl.dis_mask(logp, old, mask, 0.3, 5.0)
    assert keep.tolist() == [[0.0, 1.0, 0.0, 1.0, 1.0, 1.0]]
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 2.0]])
    loss, stats = rl.dis_loss(logp, old, adv, mask, 0.3, 5.0)
    assert loss.item() == pytest.approx(-(1.0 + 0.4 + 0.35 + 9.8), rel=1e-5)
    loss.backward()
    # d(-rho A)/dlogp = -rho A on kept tokens, 0 on masked ones
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.0, 0.0, -0.4, -0.35, -9.8]]), atol=1e-5)
    assert stats["kept"] == 4 and stats["masked_low"] == 1 and stats["masked_high"] == 1
    # padding never counts
    keep = rl.dis_mask(logp, old, torch.tensor([[1.0, 0, 0, 0, 0, 0]]), 0.3, 5.0)
    assert keep.sum() == 0


def test_group_advantages_by_hand():
    adv = rl.group_advantages([1, 0, 0, 0, 1, 1], ["a", "a", "a", "a", "b", "b"])
    std = math.sqrt(0.1875)
    assert adv[:4] == pytest.approx([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], rel=1e-5)
    assert adv[4:] == [0.0, 0.0]
    assert rl.group_advantages([1, 0], ["a", "a"], scale=False) == [0.5, -0.5]


def test_staleness_bound():
    assert rl.within_staleness(3, 7, 4) and rl.within_staleness(7, 7, 0)
    assert not rl.within_staleness(2, 7, 4)
    assert not rl.within_staleness(8, 7, 4)  # a rollout from the future is an error, not fresh


def sample(i: int, release: str, n: int = 3) -> Sample:
    return Sample(record_id=f"r{i}", prompt_ids=[1, 2], completion_ids=[3] * n, logprobs=[-1.0] * n, score=1.0,
                  release_id=release)


def test_sao_batch_drops_stale_and_takes_oldest_fresh():
    recipe = SAORecipe(batch_size=2, max_staleness=1)
    steps = {"base": 0, "s:v1": 2, "s:v2": 3}
    pool = [sample(0, "base"), sample(1, "s:v1"), sample(2, "s:v2"), sample(3, "s:v2")]
    assert recipe.ready(pool, 3, steps)
    batch, dropped = recipe.build_batch(pool, 3, steps)
    assert [s.record_id for s in dropped] == ["r0"]  # 3 steps behind: dropped
    assert [s.record_id for s in batch] == ["r1", "r2"]  # oldest fresh first
    assert not recipe.ready(pool[:2], 3, steps)


def test_sao_advantages_use_length_adaptive_lambda_and_mc_targets():
    cfg = SAORecipe().config
    s = [Sample("a", [1], [5, 6, 7], [-1.0] * 3, 1.0, "base"), Sample("b", [1], [5, 6], [-1.0] * 2, 1.0, "base")]
    adv, targets = advantages_and_targets(s, [[0.5, 0.6, 0.8], [0.3, 0.4]], cfg)
    l0 = 1 - 1 / 4.5
    a01 = 0.2 + l0 * 0.2
    assert adv[0] == pytest.approx([0.1 + l0 * a01, a01, 0.2], abs=1e-6)
    assert targets[0] == pytest.approx([1.0, 1.0, 1.0]) and targets[1] == pytest.approx([1.0, 1.0])
