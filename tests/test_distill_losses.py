"""The distillation divergences (reef_lab.trainers.losses, issue 41 item 1) against values and gradients written by
hand: on-policy distillation's reverse KL on the student's sampled tokens with a truncated importance ratio, and the
forward KL and generalised JSD over the teacher's top-K tokens; masked positions (tool results, padding) hold
anything, even inf, and get no gradient."""

from __future__ import annotations

import json
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


# ---- through the torch trainer on the tiny Llama ---------------------------------------------------------------------
def _samples(vocab: int = 40000) -> list:
    from reef_lab.trainers.samples import Sample

    out = []
    for i, (p, c) in enumerate([(6, 9), (4, 12), (9, 5)]):
        g = torch.Generator().manual_seed(10 + i)
        prompt = torch.randint(3, vocab, (p,), generator=g).tolist()
        completion = torch.randint(3, vocab, (c,), generator=g).tolist()
        mask = [0 if 2 <= k < 4 else 1 for k in range(c)]  # a tool result inside the completion
        out.append(Sample(f"d{i}", prompt, completion, [-9.0] * c, None, "base", temperature=0.7, loss_mask=mask))
    return out


def _full_logp(trainer, samples) -> list[torch.Tensor]:
    """Each sample's [completion, vocab] log-softmax at temperature 1, by a plain forward of the whole sequence."""
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt_ids + s.completion_ids])
            logits = trainer.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1: -1].float()
            out.append(torch.log_softmax(logits, -1))
    return out


def test_a_distill_step_computes_the_divergence_of_the_model_against_the_teachers_numbers(tiny_model_dir):
    """reverse_kl: the step's reported KL is sum(log pi_s(y) - log pi_t(y)) over trained tokens, the student's
    logprobs at temperature 1 (not the sampling temperature 0.7); forward_kl over the teacher's top-3: as
    topk_divergence of the model's own full softmax gathered at those ids. Masked tokens' teacher values are junk."""
    from reef_lab.trainers.base import Loss, TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lr=1e-3, micro_batch_size=2))
    samples = _samples(trainer.model.get_input_embeddings().num_embeddings)
    g = torch.Generator().manual_seed(0)
    full = _full_logp(trainer, samples)
    want_kl = 0.0
    for s, lp in zip(samples, full):
        own = lp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
        s.teacher_logprobs = [float(x) + float(torch.randn(1, generator=g)) if m else float("nan")
                              for x, m in zip(own, s.mask)]
        want_kl += sum(float(o) - t for o, t, m in zip(own, s.teacher_logprobs, s.mask) if m)
        s.logprobs = own.tolist()  # sampled by this very policy: every importance ratio 1
    m = trainer.step(samples, Loss("distill", divergence="reverse_kl", is_cap=2.0))
    assert m["reverse_kl_sum"] == pytest.approx(want_kl, rel=1e-4, abs=1e-4) and m["capped"] == 0
    assert m["tokens"] == sum(s.trained_tokens for s in samples) and math.isfinite(m["grad_norm"])

    full = _full_logp(trainer, samples)  # the model after that step
    want = 0.0
    for s, lp in zip(samples, full):
        teacher = torch.log_softmax(torch.randn(lp.shape, generator=g, dtype=torch.float64), -1)
        top = teacher.topk(3, dim=-1)
        s.teacher_top_ids = [row if mk else [0, 0, 0] for row, mk in zip(top.indices.tolist(), s.mask)]
        s.teacher_top_logprobs = [row if mk else [float("nan")] * 3 for row, mk in zip(top.values.tolist(), s.mask)]
        for t, mk in enumerate(s.mask):
            if mk:
                want += _hand("forward_kl", lp[t, top.indices[t]].tolist(), top.values[t].tolist())
    m = trainer.step(samples, Loss("distill", divergence="forward_kl"))
    assert m["forward_kl_sum"] == pytest.approx(want, rel=1e-4)


def test_distill_steps_bring_the_student_to_the_teacher(tiny_model_dir):
    """Reverse KL on fixed tokens: the student's logprobs move towards the teacher's (mean |gap| falls), and a
    sample without teacher logprobs is refused with a message that names what is missing."""
    from reef_lab.trainers.base import Loss, TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lr=2e-4))
    samples = _samples(trainer.model.get_input_embeddings().num_embeddings)

    def gaps() -> float:
        out = []
        for s, lp in zip(samples, _full_logp(trainer, samples)):
            own = lp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
            out += [abs(float(o) - t) for o, t, m in zip(own, s.teacher_logprobs, s.mask) if m]
        return sum(out) / len(out)

    for s, lp in zip(samples, _full_logp(trainer, samples)):
        own = lp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
        s.teacher_logprobs = [float(x) + (1.5 if k % 2 else -1.5) for k, x in enumerate(own)]
        s.logprobs = own.tolist()
    seen = [gaps()]
    for _ in range(4):
        trainer.step(samples, Loss("distill"))
        seen.append(gaps())
    assert seen[-1] < 0.7 * seen[0] and all(b < a for a, b in zip(seen, seen[1:])), seen
    samples[1].teacher_logprobs = None
    with pytest.raises(ValueError, match="sample d1: no teacher_logprobs"):
        trainer.step(samples, Loss("distill"))


def test_distill_loss_config_errors():
    from reef_lab.trainers.base import Loss

    for bad, says in [({"divergence": "kl"}, "divergence must be"), ({"is_cap": 0.5}, "is_cap"),
                      ({"jsd_beta": 0.0}, "jsd_beta")]:
        with pytest.raises(ValueError, match=says):
            Loss("distill", **bad)


def test_the_trainer_scores_a_teacher_on_the_students_tokens_and_refuses_another_tokenizer(tiny_model_dir, tmp_path):
    """score_teacher: the teacher (here a release of the student trained one step) scores the sample's own tokens;
    its logprobs equal a plain forward of that model, its top-K are the K largest; a teacher context (a longer
    prompt) changes them; a teacher with another tokenizer is refused, naming the fix."""
    import shutil

    from reef_lab.trainers.base import Loss, TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    teacher = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lr=1e-3))
    samples = _samples(teacher.model.get_input_embeddings().num_embeddings)
    teacher.step([s for s in _samples(teacher.model.get_input_embeddings().num_embeddings)], Loss("nll"))
    release = teacher.export(tmp_path / "v1", {"release_id": "v1"})
    student = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu"))
    student.score_teacher(samples, None, release, top_k=4)
    for s, lp in zip(samples, _full_logp(teacher, samples)):
        own = lp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(s.teacher_logprobs), own, atol=1e-5)
        assert s.teacher_top_ids == lp.topk(4, -1).indices.tolist()
    before = list(samples[0].teacher_logprobs)
    student.score_teacher(samples[:1], None, release, prompts=[[5, 6, 7] + samples[0].prompt_ids])
    assert samples[0].teacher_logprobs != before and len(samples[0].teacher_logprobs) == len(before)

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    vocab = json.loads((other / "tokenizer.json").read_text())
    vocab["model"]["vocab"] = {("x" + k if i == 7 else k): v for i, (k, v) in enumerate(vocab["model"]["vocab"].items())}
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(ValueError, match="another tokenizer than the student"):
        student.score_teacher(samples, other)


def test_the_ema_self_teacher_scores_with_the_moving_average_and_leaves_the_policy_as_it_was(tiny_model_dir):
    """score_self with `ema`: the first call scores with the policy's weights; after a step, with decay * those +
    (1 - decay) * the new weights (checked against a plain forward of a model holding that average); the policy's
    own weights are bit-identical after each call; ema 0 is the policy itself."""
    from reef_lab.trainers.base import Loss, TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer

    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lr=1e-2))
    vocab = trainer.model.get_input_embeddings().num_embeddings
    samples = _samples(vocab)
    prompts = [[5, 6] + s.prompt_ids for s in samples]  # a context the student did not see
    first = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.score_self(samples, prompts, ema=0.75)
    plain = [list(s.teacher_logprobs) for s in samples]
    trainer.score_self(samples, prompts)  # no ema: the policy itself, the same weights so far
    assert [s.teacher_logprobs for s in samples] == plain
    trainer.step(_samples(vocab), Loss("nll"))
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    assert any(not torch.equal(first[n], after[n]) for n in first)
    trainer.score_self(samples, prompts, ema=0.75)
    assert all(torch.equal(p, after[n]) for n, p in trainer.model.named_parameters())  # the policy is untouched
    reference = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu"))
    with torch.no_grad():
        for n, p in reference.model.named_parameters():
            p.copy_(first[n].lerp(after[n], 0.25))
    expected = [[], [], []]
    for i, (s, prompt) in enumerate(zip(samples, prompts)):
        ids = torch.tensor([prompt + s.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(reference.model(input_ids=ids).logits[0, len(prompt) - 1: -1].float(), -1)
        expected[i] = logp.gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)
    for s, e in zip(samples, expected):
        assert torch.allclose(torch.tensor(s.teacher_logprobs), e, atol=1e-5)
    trainer.score_self(samples, prompts)  # the policy now: neither the first weights' numbers nor the average's
    assert all(not torch.allclose(torch.tensor(s.teacher_logprobs), e, atol=1e-5) for s, e in zip(samples, expected))
    with pytest.raises(ValueError, match="decay must be in"):
        trainer.score_self(samples, prompts, ema=1.0)


def test_a_vllm_served_teacher_scores_the_students_tokens_as_the_trainer_does(tiny_model_dir):
    """teacher.server_url: a vLLM server scores each sample (prompt_logprobs on its token ids; the double follows
    vLLM's wire format and runs a real forward pass): the same logprobs and top-K as the trainer's own scoring of
    that model; a server of another tokenizer, an unknown model and mixed settings are refused."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reef_lab.learning.distill import TeacherConfig, resolve_teacher
    from reef_lab.trainers.base import TrainerConfig
    from reef_lab.trainers.torch_trainer import TorchTrainer
    from reef_lab.testing.vllm_scoring import VLLMScoringDouble, VLLMScoringServer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    server = VLLMScoringServer(VLLMScoringDouble(model, tokenizer, "teacher-7b"))
    other = VLLMScoringServer(VLLMScoringDouble(model, tokenizer, "other", shift_tokens=1))
    try:
        teacher = resolve_teacher(TeacherConfig(server_url=server.url), tiny_model_dir, releaser=None)
        assert teacher.server is not None and teacher.server.model == "teacher-7b"
        trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu"))
        samples = _samples(model.get_input_embeddings().num_embeddings)
        reference = copy.deepcopy(samples)
        teacher.server.score(samples, [[5, 6] + s.prompt_ids for s in samples], top_k=4)
        trainer.score_teacher(reference, None, None, top_k=4, prompts=[[5, 6] + s.prompt_ids for s in reference])
        for s, r in zip(samples, reference):
            assert torch.allclose(torch.tensor(s.teacher_logprobs), torch.tensor(r.teacher_logprobs), atol=1e-5)
            assert s.teacher_top_ids == r.teacher_top_ids
            assert torch.allclose(torch.tensor(s.teacher_top_logprobs), torch.tensor(r.teacher_top_logprobs),
                                  atol=1e-5)
        scored = [c for c in server.app.calls if c["path"] == "/v1/completions"]
        assert len(scored) == 3 and all(c["max_tokens"] == 1 and c["prompt_logprobs"] == 4 for c in scored)
        with pytest.raises(ValueError, match="tokenizes differently"):
            resolve_teacher(TeacherConfig(server_url=other.url), tiny_model_dir, releaser=None)
        with pytest.raises(ValueError, match="is not served at"):
            resolve_teacher(TeacherConfig(server_url=server.url, server_model="nope"), tiny_model_dir, None)
        with pytest.raises(ValueError, match="leave model_path and release unset"):
            TeacherConfig(server_url=server.url, model_path=str(tiny_model_dir))
        with pytest.raises(ValueError, match="http://host:port"):
            TeacherConfig(server_url="ftp://x")
    finally:
        server.shutdown()
        other.shutdown()
