"""Loss masks in every loss: a sample that holds an agent's episode (prompt, completion 1, tool result, completion 2)
trains only on the tokens the model generated.

By hand: nll, dis and is on a two-turn episode with values that would dominate if the masked tokens were read
(huge advantages, absurd rollout logprobs), their exact values and gradients. Through the torch trainer on a tiny
Llama: the gradient with respect to the logits at every position that predicts a tool-result token is exactly zero,
and the step's loss equals a hand computation over the masked-in tokens from the very logits the model produced.
"""

from __future__ import annotations

import math

import pytest
import torch

from reef_lab.learning import rl
from reef_lab.trainers import losses
from reef_lab.trainers.samples import Sample

# completion = completion 1 (2 tokens) + tool result (2 tokens) + completion 2 (2 tokens); one pad column after
EPISODE_MASK = [1, 1, 0, 0, 1, 1]
MASK = torch.tensor([EPISODE_MASK + [0]], dtype=torch.float32)
TRAINED = [0, 1, 4, 5]


def _logp(values):
    return torch.tensor([values], dtype=torch.float32, requires_grad=True)


def test_sample_loss_mask_is_checked():
    ok = Sample("e", [1, 2], [3, 4, 5, 6, 7, 8], None, 1.0, "base", loss_mask=EPISODE_MASK)
    assert ok.trained_tokens == 4 and ok.mask == EPISODE_MASK
    assert Sample("s", [1], [3, 4], None, 1.0, "base").mask == [1, 1]
    with pytest.raises(ValueError, match="loss mask of 2 for 6"):
        Sample("e", [1], [3, 4, 5, 6, 7, 8], None, 1.0, "base", loss_mask=[1, 0])
    with pytest.raises(ValueError, match="other than 0 and 1"):
        Sample("e", [1], [3, 4], None, 1.0, "base", loss_mask=[1, 2])
    with pytest.raises(ValueError, match="0 everywhere"):
        Sample("e", [1], [3, 4], None, 1.0, "base", loss_mask=[0, 0])


def test_nll_by_hand_on_a_two_turn_episode():
    logp = _logp([-0.5, -1.0, -9.0, -7.0, -2.0, -0.25, -3.0])
    loss, _ = losses.nll_loss(logp, MASK)
    assert loss.item() == pytest.approx(0.5 + 1.0 + 2.0 + 0.25)
    loss.backward()
    assert logp.grad[0].tolist() == [-1.0, -1.0, 0.0, 0.0, -1.0, -1.0, 0.0]


def test_dis_by_hand_on_a_two_turn_episode():
    """Ratios 0.2 (dropped by DIS), 1, 2, 1 on the generated tokens; the tool-result tokens carry a rollout logprob of
    -1e4 (a ratio of e^1e4: inf) and an advantage of 1e6, and count nowhere: not in the loss, its gradient, the
    masked_high counter or the token count."""
    old = torch.tensor([[math.log(0.5), math.log(0.5), -1e4, -1e4, math.log(0.25), math.log(0.5), 0.0]])
    ratios = [0.2, 1.0, None, None, 2.0, 1.0]
    values = [math.log(0.5 * 0.2), math.log(0.5), -1.0, -2.0, math.log(0.5), math.log(0.5), 0.0]
    logp = _logp(values)
    adv = torch.tensor([[1.0, -1.0, 1e6, 1e6, 0.5, 2.0, 1e6]])
    loss, stats = losses.dis_loss(logp, old, adv, MASK, 0.3, 5.0)
    # kept: tokens 1, 4, 5 (token 0's ratio 0.2 < 0.3); loss = -sum rho * A
    assert loss.item() == pytest.approx(-(1.0 * -1.0 + 2.0 * 0.5 + 1.0 * 2.0), rel=1e-5)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0, -1.0, -2.0, 0.0], rel=1e-5)
    assert stats == pytest.approx({"tokens": 4, "kept": 3, "masked_low": 1, "masked_high": 0,
                                   "ratio_sum": 0.2 + 1.0 + 2.0 + 1.0}, rel=1e-5)
    assert [ratios[t] for t in TRAINED] == [0.2, 1.0, 2.0, 1.0]
    assert math.isfinite(loss.item())


def test_is_by_hand_on_a_two_turn_episode():
    """-rho * (A - kl * sg(logp - logp_base)) on generated tokens only: the tool-result tokens' base logprob,
    rollout logprob and advantage are absurd and must not reach the loss, the KL counters or the gradient."""
    old = torch.tensor([[math.log(0.5), math.log(0.5), 50.0, -1e4, math.log(0.5), math.log(0.25), 0.0]])
    rho = [0.2, 1.0, None, None, 1.0, 2.0]
    cur = [0.1, 0.5, None, None, 0.5, 0.5]
    base_p = [0.5, 0.25, None, None, 0.5, 0.125]
    values = [math.log(c) if c else -3.0 for c in cur] + [0.0]
    logp = _logp(values)
    base = torch.tensor([[math.log(b) if b else 1e4 for b in base_p] + [0.0]])
    adv = torch.tensor([[1.0, 1.0, 1e6, -1e6, -0.5, 0.25, 9.0]])
    kl = 0.5
    loss, stats = losses.is_loss(logp, old, adv, MASK, base, kl_coef=kl)
    gaps = {t: math.log(cur[t] / base_p[t]) for t in TRAINED}
    shaped = {t: adv[0, t].item() - kl * gaps[t] for t in TRAINED}
    assert loss.item() == pytest.approx(-sum(rho[t] * shaped[t] for t in TRAINED), rel=1e-5)
    loss.backward()
    want = [-rho[t] * shaped[t] if t in TRAINED else 0.0 for t in range(7)]
    assert logp.grad[0].tolist() == pytest.approx(want, rel=1e-5)
    assert stats["tokens"] == 4 and stats["ratio_sum"] == pytest.approx(sum(rho[t] for t in TRAINED), rel=1e-5)
    assert stats["kl_sum"] == pytest.approx(sum(gaps.values()), rel=1e-5)
    assert stats["kl_k3_sum"] == pytest.approx(sum(math.exp(-g) - 1 + g for g in gaps.values()), rel=1e-5)


# ---- through the torch trainer on a tiny Llama ---------------------------------------------------------------------
PROMPT, C1, TOOL, C2 = [5, 9, 14, 3], [20, 31, 7], [88, 61, 90, 12], [42, 8]


def _episode(**kw) -> Sample:
    return Sample("episode", PROMPT, C1 + TOOL + C2, None, 1.0, "base",
                  loss_mask=[1] * len(C1) + [0] * len(TOOL) + [1] * len(C2), **kw)


def _single(**kw) -> Sample:
    return Sample("single", [5, 11], [42, 8, 19], None, 0.0, "base", **kw)


class _Captured(list):
    """The decoder's last hidden states of every forward that builds a graph (the training forwards), their grads
    kept, and the output layer as it was before the step: what every position's logits were."""

    def logits(self) -> torch.Tensor:
        (hidden,) = self
        return hidden.detach() @ self.head.T


def _capture_logits(model):
    seen = _Captured()
    seen.head = model.get_output_embeddings().weight.detach().clone()

    def hook(module, inputs, output):
        if output.last_hidden_state.requires_grad:
            output.last_hidden_state.retain_grad()
            seen.append(output.last_hidden_state)
    return seen, model.get_decoder().register_forward_hook(hook)


def _hand_logprobs(logits: torch.Tensor, sample: Sample, row: int) -> list[float]:
    """Each completion token's logprob read straight off the logits: position len(prompt) - 1 + k predicts token k."""
    logs = torch.log_softmax(logits[row].detach().float(), dim=-1)
    start = len(sample.prompt_ids) - 1
    return [logs[start + k, tok].item() for k, tok in enumerate(sample.completion_ids)]


def _check_tool_positions_get_no_gradient(seen: _Captured, episode: Sample) -> None:
    """No gradient reaches a position whose output predicts a given token (nor the prompt's), through the logits
    or any other way; every position that predicts a generated token gets one."""
    grad = seen[0].grad[0]
    start = len(episode.prompt_ids) - 1
    trained = [start + k for k, m in enumerate(episode.mask) if m]
    given = [start + k for k, m in enumerate(episode.mask) if not m]
    assert len(given) == len(TOOL)
    for pos in given:  # the positions whose outputs predict the tool result's tokens
        assert torch.count_nonzero(grad[pos]) == 0, f"position {pos} predicts a tool-result token and got gradient"
    for pos in range(start):  # the prompt's own positions are not predicted either
        assert torch.count_nonzero(grad[pos]) == 0
    for pos in trained:
        assert torch.count_nonzero(grad[pos]) > 0, f"position {pos} predicts a generated token and got none"


@pytest.fixture
def trainer(tiny_model_dir):
    from reef_lab.trainers.base import TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    return TorchTrainer(tiny_model_dir, TrainerConfig(lr=1e-3, device="cpu", micro_batch_size=2, max_grad_norm=0))


def test_nll_step_trains_only_generated_tokens(trainer):
    from reef_lab.trainers.base import Loss

    episode, single = _episode(), _single()
    seen, handle = _capture_logits(trainer.model)
    m = trainer.step([episode, single], Loss("nll"))
    handle.remove()
    logits = seen.logits()
    _check_tool_positions_get_no_gradient(seen, episode)
    lp_e, lp_s = _hand_logprobs(logits, episode, 0), _hand_logprobs(logits, single, 1)
    trained = [lp for lp, mk in zip(lp_e, episode.mask) if mk] + lp_s
    assert m["tokens"] == len(C1) + len(C2) + 3 == len(trained)
    assert m["loss"] == pytest.approx(-sum(trained) / len(trained), rel=1e-5)


def test_dis_step_trains_only_generated_tokens(trainer):
    """Rollout logprobs 0.1 below the trainer's (ratio e^0.1, all kept); the tool-result tokens have neither a
    logprob nor an advantage (None), which the loss never reads."""
    from reef_lab.trainers.base import Loss

    episode, single = _episode(), _single()
    now = trainer.logprobs([episode, single])
    assert [now[0][k] for k, mk in enumerate(episode.mask) if not mk] == [0.0] * len(TOOL)
    episode.logprobs = [lp - 0.1 if mk else None for lp, mk in zip(now[0], episode.mask)]
    single.logprobs = [lp - 0.1 for lp in now[1]]
    episode.advantages = [1.0, -0.5, 2.0] + [None] * len(TOOL) + [0.5, 1.5]
    single.advantages = [-1.0] * 3
    seen, handle = _capture_logits(trainer.model)
    m = trainer.step([episode, single], Loss("dis"))
    handle.remove()
    logits = seen.logits()
    _check_tool_positions_get_no_gradient(seen, episode)
    hand = _hand_logprobs(logits, episode, 0)
    total = sum(math.exp(hand[k] - episode.logprobs[k]) * a
                for k, a in enumerate(episode.advantages) if episode.mask[k])
    total += sum(math.exp(h - r) * -1.0 for h, r in zip(_hand_logprobs(logits, single, 1), single.logprobs))
    assert m["tokens"] == m["kept"] == 8
    assert m["loss"] == pytest.approx(-total / 8, rel=1e-5)
    assert losses.dis_metrics(m)["ratio_mean"] == pytest.approx(math.exp(0.1), rel=1e-4)


def test_is_step_with_kl_trains_only_generated_tokens(trainer):
    """The `is` loss with a KL term on a full fine-tune: the base is a frozen copy of the model in model_dir."""
    from reef_lab.trainers.base import Loss

    episode, single = _episode(), _single()
    for s in (episode, single):
        s.logprobs = [-2.0] * len(s.completion_ids)
        s.advantages = [1.0] * len(s.completion_ids)
    trainer.step([episode, single], Loss("is"))  # move the policy off the base first
    base = trainer.logprobs([episode, single], base=True)
    now = trainer.logprobs([episode, single])
    assert any(abs(a - b) > 1e-5 for a, b in zip(now[0], base[0]))
    episode.logprobs = [lp - 0.2 if mk else 1e4 for lp, mk in zip(now[0], episode.mask)]
    single.logprobs = [lp - 0.2 for lp in now[1]]
    episode.advantages = [0.5] * len(C1) + [1e6] * len(TOOL) + [-1.0] * len(C2)
    seen, handle = _capture_logits(trainer.model)
    m = trainer.step([episode, single], Loss("is", kl_coef=0.3))
    handle.remove()
    logits = seen.logits()
    _check_tool_positions_get_no_gradient(seen, episode)
    rows = [(episode, _hand_logprobs(logits, episode, 0), base[0]), (single, _hand_logprobs(logits, single, 1),
                                                                     base[1])]
    total = sum(math.exp(h - r) * (a - 0.3 * (h - b))
                for s, hand, bs in rows
                for h, r, a, b, mk in zip(hand, s.logprobs, s.advantages, bs, s.mask) if mk)
    assert m["tokens"] == 8
    # terms of size ~1 that nearly cancel (loss ~3e-3): float32 rounding of the logprobs shows at ~1e-7 absolute
    assert m["loss"] == pytest.approx(-total / 8, rel=1e-4, abs=1e-6)


def test_sao_advantages_run_over_the_generated_tokens_only():
    """GAE over an episode skips the tool result: the episode's advantages and value targets at its generated
    tokens equal those of the same tokens laid end to end (a 4-token single call), and are 0 at the given ones;
    the values at given positions (absurd here) are never read."""
    from recipes.sao.recipe import SAOConfig, advantages_and_targets

    cfg = SAOConfig(normalize_advantages=False)
    episode = Sample("e", [1], [3, 4, 5, 6, 7, 8], None, 1.0, "base", loss_mask=EPISODE_MASK)
    single = Sample("s", [1], [3, 4, 7, 8], None, 1.0, "base")
    values = [0.1, 0.2, 0.3, 0.4]
    (adv_e,), (tgt_e,) = advantages_and_targets([episode], [[0.1, 0.2, 1e6, -1e6, 0.3, 0.4]], cfg)
    (adv_s,), (tgt_s,) = advantages_and_targets([single], [values], cfg)
    assert [adv_e[i] for i in TRAINED] == pytest.approx(adv_s) and adv_e[2] == adv_e[3] == 0.0
    assert [tgt_e[i] for i in TRAINED] == pytest.approx(tgt_s) and tgt_e[2] == tgt_e[3] == 0.0
    # the length in the adaptive lambda is the generated tokens' count: 4, not 6
    lam = float(rl.length_adaptive_lambda(torch.tensor([4.0]), cfg.lambda_alpha)[0])
    delta = [0.2 - 0.1, 0.3 - 0.2, 0.4 - 0.3, 1.0 - 0.4]
    expected = sum((cfg.gamma * lam) ** k * d for k, d in enumerate(delta))
    assert adv_e[0] == pytest.approx(expected, rel=1e-5)


def test_a_custom_sequence_loss_sees_zeros_not_inf_where_the_mask_is_0(trainer):
    """What a plug-in SequenceLoss is handed (issue 38 item 16): logp and ref_logp are exactly 0 with no gradient on
    given tokens (a tool result) and padding, even when the recorded rollout logprobs there are -inf or missing, so a
    loss that forgets to mask (ratios, exp, log of a probability) stays finite; the step's loss is finite."""
    from reef_lab.trainers.base import SequenceLoss

    seen = {}

    class Unguarded(SequenceLoss):
        name, reference = "unguarded", True

        def __call__(self, logp, mask, samples, ref_logp):
            seen.update(logp=logp.detach().clone(), ref=ref_logp.clone(), mask=mask.clone())
            ratio = torch.exp(logp - ref_logp)  # never multiplied by the mask
            return -(ratio * torch.log(torch.exp(logp) + 1e-30)).sum(), {}

    episode = _episode()
    episode.logprobs = [-1.0] * len(C1) + [float("-inf")] * len(TOOL) + [-1.0] * len(C2)
    single = _single()
    single.logprobs = [-2.0, -2.0, -2.0]
    m = trainer.step([episode, single], Unguarded())
    assert math.isfinite(m["loss"]), m
    for name in ("logp", "ref"):
        t = seen[name]
        assert torch.isfinite(t).all(), (name, t)
        assert (t[seen["mask"] == 0] == 0).all(), (name, t)
