"""The torch trainer's memory bounds (issue 38 item 18) change no number: the chunked logprobs, token-bounded
micro-batches and gradient checkpointing give the straightforward path's loss and gradients on the tiny Llama, and
what they exist for holds (no vocabulary-wide logits of a whole micro-batch kept for the backward pass, no
gradients held between steps). The measured case is results/trainer-memory.md (scripts/bench/trainer_memory.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from reef_lab.trainers import losses  # noqa: E402
from reef_lab.trainers.samples import Sample  # noqa: E402
from reef_lab.trainers.base import Loss, TrainerConfig  # noqa: E402
from reef_lab.trainers.logprobs import check_logit_path, full_token_logprobs, token_logprobs  # noqa: E402
from reef_lab.trainers.torch_trainer import TorchTrainer, pack  # noqa: E402


def episodes() -> list[Sample]:
    """Samples of unequal lengths (padding), given tokens inside the completion (mask 0), other temperatures."""
    out = []
    for i, (p, c, temp) in enumerate([(7, 12, 1.0), (4, 20, 0.7), (11, 5, 1.3), (6, 16, 1.0)]):
        g = torch.Generator().manual_seed(i)
        prompt = torch.randint(3, 40000, (p,), generator=g).tolist()
        completion = torch.randint(3, 40000, (c,), generator=g).tolist()
        mask = [0 if 3 <= k < 7 else 1 for k in range(c)]
        s = Sample(f"s{i}", prompt, completion, [-2.0] * c, float(i % 2), "base", temperature=temp,
                   group=f"g{i // 2}", loss_mask=mask)
        s.advantages = [0.5 - i % 2] * c
        out.append(s)
    return out


def loss_and_grads(trainer: TorchTrainer, fn) -> tuple[float, dict[str, torch.Tensor]]:
    trainer.model.zero_grad(set_to_none=True)
    batch = pack(episodes(), trainer.pad_id, trainer.device)
    loss, _ = losses.dis_token_loss(0.3, 5.0)(fn(trainer.model, batch), batch, episodes())
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_chunked_logprobs_give_the_full_logits_loss_and_gradients(tiny_model_dir, lora_rank):
    """Chunks of 3 trained positions (several per sequence, the last one short) against log_softmax over every
    position's logits: values, loss and every parameter's gradient agree; masked positions are 0."""
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lora_rank=lora_rank))
    batch = pack(episodes(), trainer.pad_id, trainer.device)
    with torch.no_grad():
        full, chunked = full_token_logprobs(trainer.model, batch), token_logprobs(trainer.model, batch, 3)
    assert torch.allclose(chunked, full, atol=1e-5)
    assert bool((chunked[batch["mask"] == 0] == 0).all()) and bool((chunked[batch["mask"] == 1] < 0).all())
    loss_full, grads_full = loss_and_grads(trainer, full_token_logprobs)
    loss_chunked, grads_chunked = loss_and_grads(trainer, lambda m, b: token_logprobs(m, b, 3))
    assert loss_chunked == pytest.approx(loss_full, rel=1e-5)
    assert grads_full.keys() == grads_chunked.keys() and grads_full
    for name, g in grads_full.items():
        assert torch.allclose(grads_chunked[name], g, rtol=1e-4, atol=1e-6), name


def test_no_vocabulary_wide_logits_of_the_micro_batch_are_kept_for_backward(tiny_model_dir):
    """What autograd keeps between forward and backward holds at most `logprob_chunk` positions' logits (before:
    [B, T, vocab] and several [B, Tc, vocab] copies)."""
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", logprob_chunk=4))
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    kept: list[tuple] = []

    def keep(t):
        kept.append(tuple(t.shape))
        return t
    samples = episodes()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        m = trainer.step(samples, Loss("dis"))
    assert m["tokens"] == sum(s.trained_tokens for s in samples)
    wide = [shape for shape in kept if shape and shape[-1] == vocab and len(shape) > 1]
    assert max((torch.Size(s).numel() // vocab for s in wide), default=0) <= 4, wide


def test_a_step_holds_no_gradients_afterwards(tiny_model_dir):
    """The gradients (one more copy of the trained weights) are freed once the optimizer has used them."""
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu"))
    trainer.step(episodes(), Loss("dis"))
    assert all(p.grad is None for p in trainer.params)


def steps(tiny_model_dir, **config) -> tuple[list[dict], list[torch.Tensor]]:
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", lr=1e-2, micro_batch_size=4, **config))
    metrics = [trainer.step(episodes(), Loss("dis")) for _ in range(2)]
    return metrics, [p.detach().clone() for p in trainer.params]


@pytest.mark.parametrize("config", [{"micro_batch_tokens": 45}, {"gradient_checkpointing": True},
                                    {"logprob_chunk": 0}])
def test_memory_settings_leave_the_steps_as_they_were(tiny_model_dir, config):
    """Two steps with a memory setting give the default's losses, gradient norms and weights: micro-batches of at
    most 45 padded positions (the 4 samples then run as 3 micro-batches), recomputed layers, the full logits."""
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", micro_batch_size=4, **config))
    assert len(list(trainer.micro_batches(episodes()))) == (3 if "micro_batch_tokens" in config else 1)
    base_metrics, base_weights = steps(tiny_model_dir)
    metrics, weights = steps(tiny_model_dir, **config)
    for m, b in zip(metrics, base_metrics, strict=True):
        assert m["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-7)
        assert m["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for w, b in zip(weights, base_weights, strict=True):
        assert torch.allclose(w, b, rtol=1e-4, atol=1e-6)


def test_token_budget_keeps_groups_whole_and_runs_an_oversized_group_alone(tiny_model_dir):
    trainer = TorchTrainer(tiny_model_dir, TrainerConfig(device="cpu", micro_batch_size=8, micro_batch_tokens=30))
    sizes = [[s.record_id for s in chunk] for chunk, _ in trainer.micro_batches(episodes(), group=2)]
    assert sizes == [["s0", "s1"], ["s2", "s3"]]  # each pair is over 30 positions: alone, never split


def test_a_model_whose_logits_are_not_its_output_layer_on_its_hidden_states_is_refused(tiny_model_dir):
    """A model that rescales its logits after the output layer (soft-capping, a logit scale) would train on other
    numbers than it serves under the chunked path: the trainer refuses it, naming logprob_chunk 0."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    check_logit_path(model, torch.device("cpu"))  # a plain Llama passes
    model.register_forward_hook(lambda module, args, out: out.__setitem__("logits", out["logits"] * 0.5) or out)
    with pytest.raises(ValueError, match="logprob_chunk: 0"):
        check_logit_path(model, torch.device("cpu"))


def test_memory_settings_are_checked():
    with pytest.raises(ValueError, match="micro_batch_tokens and logprob_chunk"):
        TrainerConfig(micro_batch_tokens=-1)
    with pytest.raises(ValueError, match="micro_batch_tokens and logprob_chunk"):
        TrainerConfig(logprob_chunk=-5)
