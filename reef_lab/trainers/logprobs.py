"""Each completion token's logprob under the policy, without the vocabulary-wide logits of a whole micro-batch.

Why. The straightforward way (`full_token_logprobs`) takes the model's logits at every position, [B, T, vocab] in
fp32, gathers the completion positions and runs log_softmax over the vocabulary: with SmolLM2's 49,152-token
vocabulary that is 196 KB per position per copy, and autograd keeps several copies of it (the logits, the gathered
and tempered ones, the log_softmax output) until the backward pass, which makes as many again. On 4 tool episodes
of ~600 tokens that is over 2 GB, more than the 135M model and its AdamW state together (results/trainer-memory.md).

`token_logprobs` runs the model's decoder to its last hidden states ([B, T, hidden], small), keeps only the positions
the loss trains (the mask's 1s), and applies the output layer to `chunk` of them at a time: each chunk's logprob is
logit[target] - logsumexp(logits), and under autograd each chunk is recomputed in the backward pass
(torch.utils.checkpoint) instead of being kept, so at most one chunk's logits exist at a time. The numbers are the
straightforward ones (tests/test_trainer_memory.py compares values and gradients).

It needs the model to compute its logits as `get_output_embeddings()(get_decoder()(...).last_hidden_state)`, which
transformers' causal LMs do unless they rescale logits after the output layer (soft-capping, a logit scale):
`check_logit_path` compares the two on a few tokens when a trainer loads a model and refuses one that differs.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def full_token_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[B, Tc] logprob of each completion token under log_softmax(logits / temperature) from the model's logits at
    every position; 0 (and no gradient) where the loss mask is 0. The reference the chunked path is tested against
    (TrainerConfig.logprob_chunk 0 selects it)."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    index = batch["gather"][..., None].expand(-1, -1, out.logits.shape[-1])
    logits = out.logits.gather(1, index).float() / batch["temperature"][:, None, None]
    all_logp = torch.log_softmax(logits, dim=-1)
    on = batch["mask"].bool()
    if "topk_ids" in batch:
        batch["student_topk"] = torch.where(on[..., None], all_logp.gather(-1, batch["topk_ids"]), 0.0)
    return torch.where(on, all_logp.gather(-1, batch["targets"][..., None]).squeeze(-1), 0.0)


def _chosen(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """[n, J] log softmax(head(hidden) / temperature)[targets] of n positions, J token ids each."""
    logits = head(hidden).float() / temperature[:, None]
    return logits.gather(-1, targets) - torch.logsumexp(logits, dim=-1, keepdim=True)


def token_logprobs(model, batch: dict[str, torch.Tensor], chunk: int) -> torch.Tensor:
    """[B, Tc] as full_token_logprobs, with the output layer applied to `chunk` trained positions at a time (and,
    under autograd, again in the backward pass instead of keeping their logits); `chunk` 0: full_token_logprobs.
    When the batch holds `topk_ids` ([B, Tc, K]: a teacher's top-K tokens per position, for a top-K divergence),
    the same pass also puts their logprobs in batch["student_topk"] ([B, Tc, K], 0 where the mask is 0)."""
    if chunk <= 0:
        return full_token_logprobs(model, batch)
    hidden = model.get_decoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 use_cache=False).last_hidden_state
    rows, cols = batch["mask"].bool().nonzero(as_tuple=True)
    picked = hidden[rows, batch["gather"][rows, cols]]  # [N, hidden]: the positions that predict trained tokens
    targets, temps = batch["targets"][rows, cols][:, None], batch["temperature"][rows]
    if "topk_ids" in batch:
        targets = torch.cat([targets, batch["topk_ids"][rows, cols]], dim=1)  # [N, 1 + K]
    head = model.get_output_embeddings()
    parts = []
    for i in range(0, len(rows), chunk):
        args = (head, picked[i: i + chunk], targets[i: i + chunk], temps[i: i + chunk])
        parts.append(checkpoint(_chosen, *args, use_reentrant=False) if torch.is_grad_enabled() else _chosen(*args))
    got = torch.cat(parts).float() if parts else torch.zeros((0, targets.shape[1]), device=hidden.device)
    out = torch.zeros(batch["mask"].shape, dtype=torch.float32, device=hidden.device)  # fp32, as log_softmax's
    if "topk_ids" in batch:
        topk = torch.zeros(batch["topk_ids"].shape, dtype=torch.float32, device=hidden.device)
        batch["student_topk"] = topk.index_put((rows, cols), got[:, 1:])
    return out.index_put((rows, cols), got[:, 0])


@torch.no_grad()
def check_logit_path(model, device: torch.device) -> None:
    """Refuse a model whose logits are not its output layer applied to its decoder's last hidden states (the
    chunked path would compute other numbers than the model's own forward): compared on 8 tokens."""
    was_training = model.training
    model.eval()
    try:
        ids = torch.arange(1, 9, device=device)[None]
        full = model(input_ids=ids, use_cache=False).logits.float()
        split = model.get_output_embeddings()(model.get_decoder()(input_ids=ids, use_cache=False)
                                              .last_hidden_state).float()
    finally:
        model.train(was_training)
    if not torch.allclose(full, split, rtol=1e-4, atol=1e-4 * float(full.abs().max().clamp(min=1))):
        raise ValueError(f"{type(model).__name__} computes its logits other than get_output_embeddings() applied to "
                         "get_decoder()'s last hidden states (logit soft-capping or scaling?): the trainer's chunked "
                         "logprobs would differ from the model's; set trainer.logprob_chunk: 0 (the full logits, "
                         "more memory)")


@torch.no_grad()
def teacher_scores(model, prompt_ids: list[int], completion_ids: list[int], top_k: int, chunk: int = 256,
                   device: torch.device | None = None) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """A teacher's view of a student's tokens, at temperature 1 and with no new token generated: the logprob of
    each completion token after `prompt_ids` (which may hold more than the student saw: a teacher context), and
    (top_k > 0) the teacher's top-K token ids and their logprobs at each completion position. The output layer runs
    on `chunk` positions at a time, so no [length, vocabulary] logits of a whole sequence exist."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=device)
    hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
    head = model.get_output_embeddings()
    start, n = len(prompt_ids) - 1, len(completion_ids)
    targets = torch.tensor(completion_ids, device=hidden.device)
    chosen, top_ids, top_lp = [], [], []
    for i in range(0, n, chunk):
        logp = torch.log_softmax(head(hidden[start + i: start + min(i + chunk, n)]).float(), dim=-1)
        chosen += logp.gather(-1, targets[i: i + chunk, None]).squeeze(-1).tolist()
        if top_k:
            top = logp.topk(top_k, dim=-1)
            top_ids += top.indices.tolist()
            top_lp += top.values.tolist()
    return chosen, top_ids, top_lp


def check_same_tokenizer(student_dir, teacher_dir) -> None:
    """Refuse a teacher whose tokenizer is not the student's: distillation compares the two models' logprobs of
    the same token ids, and a re-tokenised text would compare different things (the refusal names both)."""
    from transformers import AutoTokenizer

    a = AutoTokenizer.from_pretrained(student_dir, local_files_only=True)
    b = AutoTokenizer.from_pretrained(teacher_dir, local_files_only=True)
    if a.get_vocab() != b.get_vocab() or a.all_special_tokens != b.all_special_tokens:
        raise ValueError(f"the teacher at {teacher_dir} has another tokenizer than the student at {student_dir} "
                         f"({len(b.get_vocab())} vs {len(a.get_vocab())} tokens): distillation scores the student's "
                         "own token ids and never re-tokenises; pick a teacher of the same tokenizer (a release of "
                         "this model, or a larger model of the same family)")
