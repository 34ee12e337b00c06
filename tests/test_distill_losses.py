"""The distillation divergences (reef_lab.trainers.losses, issue 41 item 1) against values and gradients written by
hand: on-policy distillation's reverse KL on the student's sampled tokens with a truncated importance ratio, and the
forward KL and generalised JSD over the teacher's top-K tokens; masked positions (tool results, padding) hold
anything, even inf, and get no gradient."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from reef_lab.trainers.losses import opd_loss, topk_divergence  # noqa: E402

INF = float("inf")


def test_opd_loss_value_and_gradient_by_hand():
    # two sequences; position (0, 2) is a tool result (mask 0) whose teacher and rollout logprobs are junk
    logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -3.0, 0.0]], dtype=torch.float64, requires_grad=True)
    teacher = torch.tensor([[-0.7, -0.4, -INF], [-0.2, -1.0, 5.0]], dtype=torch.float64)
    rollout = torch.tensor([[-0.5, -1.5, INF], [-0.9, -3.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.float64)
    cap = 1.5
    loss, stats = opd_loss(logp, teacher, rollout, mask, cap)
    loss.backward()
    want_grad, kl, capped = [[0.0] * 3 for _ in range(2)], 0.0, 0
    for b in range(2):
        for t in range(3):
            if not mask[b, t]:
                continue
            d = logp[b, t].item() - teacher[b, t].item()
            rho = math.exp(logp[b, t].item() - rollout[b, t].item())
            capped += rho > cap
            want_grad[b][t] = min(rho, cap) * d
            kl += d
    assert stats["reverse_kl_sum"] == pytest.approx(kl) and stats["tokens"] == 4 and stats["capped"] == capped == 2
    assert torch.allclose(logp.grad, torch.tensor(want_grad, dtype=torch.float64))
    assert math.isfinite(loss.item())


def _renorm(xs: list[float]) -> list[float]:
    z = math.log(sum(math.exp(x) for x in xs))
    return [x - z for x in xs]


def _hand(kind: str, s: list[float], t: list[float], beta: float = 0.5) -> float:
    s, t = _renorm(s), _renorm(t)
    if kind == "forward_kl":
        return sum(math.exp(a) * (a - b) for a, b in zip(t, s))
    m = [math.log(beta * math.exp(a) + (1 - beta) * math.exp(b)) for a, b in zip(t, s)]
    return (beta * sum(math.exp(a) * (a - c) for a, c in zip(t, m))
            + (1 - beta) * sum(math.exp(b) * (b - c) for b, c in zip(s, m)))


@pytest.mark.parametrize("kind, beta", [("forward_kl", 0.5), ("jsd", 0.5), ("jsd", 0.1)])
def test_topk_divergence_values_by_hand_and_gradient(kind, beta):
    g = torch.Generator().manual_seed(3)
    student = torch.log_softmax(torch.randn(2, 3, 50, generator=g, dtype=torch.float64), -1)
    teacher = torch.log_softmax(torch.randn(2, 3, 50, generator=g, dtype=torch.float64), -1)
    ids = teacher.topk(4, dim=-1).indices  # the teacher's top-4 at each position
    s_k = student.gather(-1, ids).requires_grad_(True)
    t_k = teacher.gather(-1, ids)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.float64)
    s_k_junk = torch.where(mask.bool()[..., None], s_k, torch.full_like(s_k, -INF))  # masked: anything, even -inf
    total, stats = topk_divergence(s_k_junk, t_k, mask, kind, beta)
    want = sum(_hand(kind, s_k[b, p].tolist(), t_k[b, p].tolist(), beta)
               for b in range(2) for p in range(3) if mask[b, p])
    assert total.item() == pytest.approx(want, rel=1e-9) and stats[f"{kind}_sum"] == pytest.approx(want, rel=1e-9)
    total.backward()
    assert bool((s_k.grad[~mask.bool()] == 0).all())
    # the gradient is the derivative of the hand-written value: central differences on one trained position
    b, p, k, h = 1, 2, 1, 1e-6
    row = s_k[b, p].tolist()
    up, down = row.copy(), row.copy()
    up[k] += h
    down[k] -= h
    numeric = (_hand(kind, up, t_k[b, p].tolist(), beta) - _hand(kind, down, t_k[b, p].tolist(), beta)) / (2 * h)
    assert s_k.grad[b, p, k].item() == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_topk_divergence_is_zero_when_the_student_matches_and_refuses_unknown_kinds():
    t = torch.log_softmax(torch.randn(1, 2, 5, dtype=torch.float64), -1)
    mask = torch.ones(1, 2, dtype=torch.float64)
    for kind in ("forward_kl", "jsd"):
        assert topk_divergence(t.clone(), t, mask, kind)[0].item() == pytest.approx(0.0, abs=1e-12)
        assert topk_divergence(t + 0.3, t, mask, kind)[0].item() == pytest.approx(0.0, abs=1e-12)  # renormalised
    with pytest.raises(ValueError, match="forward_kl or jsd"):
        topk_divergence(t, t, mask, "reverse_kl")
    with pytest.raises(ValueError, match="beta"):
        topk_divergence(t, t, mask, "jsd", beta=1.0)
