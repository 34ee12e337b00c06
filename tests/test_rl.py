"""The training arithmetic against hand-computed values: GAE (both lambdas), the DIS mask and loss, GRPO's group
baseline, the staleness bound and how SAO's batch builder applies it; TTT-Discover's `is` loss, by hand and as one
step of the torch trainer on a tiny LoRA model."""

from __future__ import annotations

import math

import pytest
import torch

from reef_lab.learning import rl
from reef_lab.trainers import losses
from reef_lab.trainers.samples import Sample
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
    keep = losses.dis_mask(logp, old, mask, 0.3, 5.0)
    assert keep.tolist() == [[0.0, 1.0, 0.0, 1.0, 1.0, 1.0]]
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 2.0]])
    loss, stats = losses.dis_loss(logp, old, adv, mask, 0.3, 5.0)
    assert loss.item() == pytest.approx(-(1.0 + 0.4 + 0.35 + 9.8), rel=1e-5)
    loss.backward()
    # d(-rho A)/dlogp = -rho A on kept tokens, 0 on masked ones
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -1.0, 0.0, -0.4, -0.35, -9.8]]), atol=1e-5)
    assert stats["kept"] == 4 and stats["masked_low"] == 1 and stats["masked_high"] == 1
    # padding never counts
    keep = losses.dis_mask(logp, old, torch.tensor([[1.0, 0, 0, 0, 0, 0]]), 0.3, 5.0)
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


def test_is_loss_by_hand():
    """TTT-Discover's loss: -rho * (A - kl * sg(logp - logp_base)) on every real token, no mask, no clip."""
    old = torch.tensor([[math.log(0.5), math.log(0.5), math.log(0.5), 0.0]])
    ratios = torch.tensor([[0.2, 1.0, 6.0, 1.0]])  # 0.2 and 6.0 would be masked by DIS; here they count
    logp = (old + ratios.log()).clone().requires_grad_(True)
    base = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.5), 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, -0.5, 9.0]])
    loss, stats = losses.is_loss(logp, old, adv, mask, base, kl_coef=0.5)
    gaps = [math.log(0.1 / 0.5), math.log(0.5 / 0.25), math.log(3.0 / 0.5)]  # logp - logp_base per real token
    shaped = [1.0 - 0.5 * gaps[0], 1.0 - 0.5 * gaps[1], -0.5 - 0.5 * gaps[2]]
    assert loss.item() == pytest.approx(-(0.2 * shaped[0] + 1.0 * shaped[1] + 6.0 * shaped[2]), rel=1e-5)
    loss.backward()
    # d(-rho * a)/dlogp = -rho * a with a held fixed (the KL gap is detached); padding gets nothing
    assert logp.grad[0].tolist() == pytest.approx([-0.2 * shaped[0], -shaped[1], -6.0 * shaped[2], 0.0], rel=1e-5)
    assert stats["tokens"] == 3 and stats["ratio_sum"] == pytest.approx(7.2, rel=1e-5)
    assert stats["kl_sum"] == pytest.approx(sum(gaps), rel=1e-5)
    k3 = sum(math.exp(-g) - 1 + g for g in gaps)
    assert stats["kl_k3_sum"] == pytest.approx(k3, rel=1e-5)
    # without a base the KL term is absent; asking for one without base logprobs is refused
    plain, _ = losses.is_loss(logp.detach(), old, adv, mask)
    assert plain.item() == pytest.approx(-(0.2 * 1.0 + 1.0 * 1.0 + 6.0 * -0.5), rel=1e-5)
    with pytest.raises(ValueError, match="base"):
        losses.is_loss(logp.detach(), old, adv, mask, None, kl_coef=0.1)


def test_loss_kinds_are_checked():
    from reef_lab.trainers.base import Loss

    assert Loss("is", kl_coef=0.1).kl_coef == 0.1
    with pytest.raises(ValueError, match="'is' loss only"):
        Loss("dis", kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        Loss("is", kl_coef=-1.0)
    with pytest.raises(ValueError, match="kl_coef"):
        Loss("is", kl_coef=float("nan"))


def test_is_step_on_a_tiny_lora_model_matches_a_hand_computation(tiny_model_dir):
    """The torch trainer's `is` step: its loss equals the formula on the trainer's own current and base logprobs
    (the base with LoRA adapters off), and the step moves only the adapters."""
    from reef_lab.trainers.base import Loss, TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(lr=5e-2, lora_rank=4, device="cpu", micro_batch_size=1))
    samples = [Sample("a", [5, 9, 14], [20, 31, 7], None, 1.0, "base"),
               Sample("b", [5, 11], [42, 8], None, 0.0, "base")]
    # move the adapters off zero first, so the policy differs from the base and the KL term is not trivially 0
    for s in samples:
        s.advantages = [1.0] * len(s.completion_ids)
        s.logprobs = [-3.0] * len(s.completion_ids)
    trainer.step(samples, Loss("is"))
    current, base = trainer.logprobs(samples), trainer.logprobs(samples, base=True)
    assert any(abs(c - b) > 1e-4 for cs, bs in zip(current, base) for c, b in zip(cs, bs))
    rollout = [[c - 0.3 for c in cs] for cs in current]  # the engine's recorded logprobs: rho = e^0.3 everywhere
    advantages = [[1.5] * 3, [-0.5] * 2]
    for s, r, a in zip(samples, rollout, advantages):
        s.logprobs, s.advantages = r, a
    kl = 0.2
    expected = -sum(math.exp(c - r) * (a - kl * (c - b))
                    for cs, bs, rs, advs in zip(current, base, rollout, advantages)
                    for c, b, r, a in zip(cs, bs, rs, advs)) / 5
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    m = trainer.step(samples, Loss("is", kl_coef=kl))
    assert m["loss"] == pytest.approx(expected, rel=1e-4)
    assert m["kl_sum"] == pytest.approx(sum(c - b for cs, bs in zip(current, base) for c, b in zip(cs, bs)),
                                        rel=1e-4)
    assert losses.is_metrics(m)["ratio_mean"] == pytest.approx(math.exp(0.3), rel=1e-4)
    assert samples[0].base_logprobs == pytest.approx(base[0], abs=1e-6)
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, adapters[n])]
    assert changed and all("lora" in n for n in changed)
    assert all(torch.equal(p, frozen[n]) for n, p in trainer.model.named_parameters() if not p.requires_grad)


def test_nll_trains_the_models_own_distribution_whatever_temperature_sampled_the_completion(tiny_model_dir):
    """SFT's loss is the completion's NLL at temperature 1: a rollout sampled at 0.5 is imitated as text, not as a
    tempered distribution (the serving temperature is applied when sampling; training it in would apply it twice).
    Before, the NLL was taken under logits / 0.5 and this loss differed."""
    from reef_lab.trainers.base import Loss, TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(lr=1e-3, device="cpu", micro_batch_size=2))
    samples = [Sample("hot", [5, 9, 14], [20, 31, 7], None, 1.0, "base", temperature=0.5),
               Sample("plain", [5, 11], [42, 8], None, 1.0, "base", temperature=1.0)]
    at_one = trainer.logprobs([Sample(s.record_id, s.prompt_ids, s.completion_ids, None, 1.0, "base")
                               for s in samples])
    at_sampled = trainer.logprobs(samples)
    assert at_sampled[0] != pytest.approx(at_one[0], rel=1e-3)  # the temperatures do give different NLLs here
    m = trainer.step(samples, Loss("nll"))
    assert m["loss"] == pytest.approx(-sum(sum(x) for x in at_one) / 5, rel=1e-5)
    assert samples[0].temperature == 0.5  # the caller's samples are left as they were
