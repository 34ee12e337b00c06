"""The in-process torch trainer: one optimizer step at a time on a batch of samples, CPU or CUDA.

It exists so that one machine serves and trains with no other process: the trainer holds its own copy of the
policy (full fine-tune, or LoRA adapters through peft), computes each completion token's logprob under the sampling
temperature the rollout used (so the ratio to the engine's recorded logprob is meaningful), and steps AdamW with
gradient accumulation over micro-batches. The loss is a recipe's function of those logprobs; it returns a *sum*
over tokens and the trainer divides by the batch's trained-token count (the loss masks' 1s), so micro-batching never
changes the update. A recipe's own SequenceLoss (reef_lab.trainers.base) is run the same way, divided by its units.

`export(folder, metadata)` writes a checkpoint as a Hugging Face model folder (safetensors with reef_lab metadata,
config, tokenizer, generation config): loadable by `from_pretrained` and by the engine's `load_release`.
A `ValueModel` (the policy's trunk plus a scalar head) serves recipes with a critic.
"""

from __future__ import annotations

import copy
import ctypes
import logging
import math
import os
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from reef_lab.extras import need

need("train", "the torch trainer")
import torch

from reef_lab.checkpoints import load_checkpoint, stamp_checkpoint
from reef_lab.trainers.samples import Sample
from reef_lab.trainers.base import (Critic, CriticConfig, DistillTrainer, Loss, SequenceLoss, SequenceLossTrainer,
                                    TrainerConfig, check_token_ids)
from reef_lab.trainers import losses
from reef_lab.trainers.divergences import divergence
from reef_lab.trainers.logprobs import check_logit_path, check_same_tokenizer, teacher_scores, token_logprobs

log = logging.getLogger("reef_lab.trainer")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_causal_lm(model_dir: str | Path, init_folder: str | Path | None, device: torch.device):
    """The base model from `model_dir`, with the weights of `init_folder` (a release) when given."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    if init_folder is not None:
        load_checkpoint(model, Path(init_folder))
    return model.to(device)


def pack(samples: list[Sample], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion ids, and per completion token: the index of the position whose output
    predicts it (`gather`, [B, Tc]), the loss mask (1 on generated tokens, 0 on given ones and padding), the rollout
    logprobs (0 where the mask is 0) and the temperature."""
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    width, tc = max(lengths), max(len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    gather = torch.zeros((len(samples), tc), dtype=torch.long)
    mask = torch.zeros((len(samples), tc), dtype=torch.float32)
    old = torch.zeros((len(samples), tc), dtype=torch.float32)
    targets = torch.full((len(samples), tc), pad_id, dtype=torch.long)
    for i, s in enumerate(samples):
        seq = s.prompt_ids + s.completion_ids
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        n = len(s.completion_ids)
        gather[i, :n] = torch.arange(len(s.prompt_ids) - 1, len(s.prompt_ids) - 1 + n)
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
        targets[i, :n] = torch.tensor(s.completion_ids)
        if s.logprobs is not None:
            old[i, :n] = torch.tensor([lp if m else 0.0 for lp, m in zip(s.logprobs, s.mask)], dtype=torch.float32)
    temps = torch.tensor([s.temperature for s in samples], dtype=torch.float32)
    out = {"input_ids": ids, "attention_mask": attn, "gather": gather, "mask": mask, "old_logprobs": old,
           "targets": targets, "temperature": temps}
    return {k: v.to(device) for k, v in out.items()}


LossFn = Callable[[torch.Tensor, dict[str, torch.Tensor], list[Sample]], tuple[torch.Tensor, dict]]


def _torch_losses() -> dict[str, Callable[[Loss], LossFn]]:
    return {"nll": lambda loss: lambda logp, batch, chunk: losses.nll_loss(logp, batch["mask"]),
            "dis": lambda loss: losses.dis_token_loss(loss.dis_low, loss.dis_high),
            "is": lambda loss: losses.is_token_loss(loss.kl_coef),
            "distill": lambda loss: losses.distill_token_loss(loss.divergence, loss.is_cap, loss.jsd_beta)}


def loss_function(loss: Loss) -> LossFn:
    """The torch form of a recipe's Loss: every kind of LOSSES by name, anything else refused (never a default)."""
    table = _torch_losses()
    if loss.kind not in table:
        raise ValueError(f"the torch trainer has no loss {loss.kind!r}; it runs {sorted(table)} (reef_lab.trainers."
                         "base.LOSSES) and a recipe's own SequenceLoss")
    return table[loss.kind](loss)


def sequence_loss_function(loss: SequenceLoss) -> LossFn:
    def fn(logp, batch, chunk):
        return loss(logp, batch["mask"], chunk, batch.get("ref_logprobs"))
    return fn


class TorchTrainer(SequenceLossTrainer, DistillTrainer):
    """The policy being trained. `step(samples, loss)` is one optimizer step; `export` writes a checkpoint."""

    def __init__(self, model_dir: str | Path, config: TrainerConfig | None = None,
                 init_folder: str | Path | None = None, tokenizer=None):
        self.config = config or TrainerConfig()
        self.model_dir = Path(model_dir)
        self.device = resolve_device(self.config.device)
        torch.manual_seed(self.config.seed)
        self.init_folder = init_folder
        # A LoRA run that resumes from a release continues that release's adapter on the base weights, so every
        # adapter it exports applies to the base (what an engine serving adapters by name loads beside the base).
        adapter = Path(init_folder) / "adapter" if init_folder is not None and self.config.lora_rank else None
        resume_adapter = adapter is not None and (adapter / "adapter_config.json").is_file()
        fix_mmap_threshold()
        self.model = load_causal_lm(model_dir, None if resume_adapter else init_folder, self.device)
        if self.config.gradient_checkpointing:  # non-reentrant: LoRA's frozen inputs need no require_grad hook
            with warnings.catch_warnings():  # transformers 5 renamed it (activation_...); 4.x has only this name
                warnings.simplefilter("ignore", FutureWarning)
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if tokenizer is None:
            from transformers import AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        if resume_adapter:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(self.model, adapter, is_trainable=True).to(self.device)
        elif self.config.lora_rank:
            from peft import LoraConfig, get_peft_model

            self.model = get_peft_model(self.model, LoraConfig(
                r=self.config.lora_rank, lora_alpha=self.config.lora_alpha, lora_dropout=self.config.lora_dropout,
                target_modules=self.config.lora_targets, task_type="CAUSAL_LM"))
        if self.config.logprob_chunk:
            check_logit_path(self.model, self.device)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=self.config.lr, weight_decay=self.config.weight_decay,
                                           betas=tuple(self.config.betas))
        self.steps = 0
        self._frozen_base = None  # a full fine-tune's frozen copy of the base model, loaded when first asked for
        self._teacher, self._teacher_key = None, None  # a distillation teacher, loaded when first asked for
        self._ema: tuple[float, dict[str, torch.Tensor]] | None = None  # score_self's EMA teacher: decay, weights

    def micro_batches(self, samples: list[Sample], group: int = 1):
        """Consecutive whole groups of samples, at most micro_batch_size of them and (micro_batch_tokens) at most
        that many padded positions; a group over the token budget runs alone."""
        size = max(group, self.config.micro_batch_size // group * group)  # a group never straddles two
        check_token_ids(samples, self.model.get_input_embeddings().num_embeddings)
        budget = self.config.micro_batch_tokens or math.inf
        chunk: list[Sample] = []
        for i in range(0, len(samples), group):
            new = samples[i: i + group]
            width = max(len(s.prompt_ids) + len(s.completion_ids) for s in chunk + new)
            if chunk and (len(chunk) + len(new) > size or (len(chunk) + len(new)) * width > budget):
                yield chunk, pack(chunk, self.pad_id, self.device)
                chunk = []
            chunk += new
        if chunk:
            yield chunk, pack(chunk, self.pad_id, self.device)

    @torch.no_grad()
    def base_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, Tc] under the frozen base: the LoRA adapters switched off, or (full fine-tune) a frozen copy of the
        base model in model_dir, loaded on first use (it costs one more model's memory)."""
        if self.config.lora_rank:
            with self.model.disable_adapter():
                return token_logprobs(self.model, batch, self.config.logprob_chunk)
        if self._frozen_base is None:
            self._frozen_base = load_causal_lm(self.model_dir, None, self.device).eval().requires_grad_(False)
        return token_logprobs(self._frozen_base, batch, self.config.logprob_chunk)

    def score_teacher(self, samples: list[Sample], teacher_dir: str | Path | None, teacher_release=None,
                      top_k: int = 0, prompts: list[list[int]] | None = None) -> None:
        """Fill each sample's teacher fields (teacher_logprobs, and with top_k the teacher's top-K per token): the
        teacher is the model in `teacher_dir` (its tokenizer must be the student's) with the weights of release
        folder `teacher_release` if given, loaded once and frozen; it reads `prompts[i]` (default: the sample's own
        prompt; a teacher context puts more in front) followed by the sample's own completion tokens."""
        key = (str(teacher_dir or self.model_dir), str(teacher_release))
        if self._teacher_key != key:
            if teacher_dir is not None and Path(teacher_dir) != self.model_dir:
                check_same_tokenizer(self.model_dir, teacher_dir)
            self._teacher = load_causal_lm(teacher_dir or self.model_dir, teacher_release,
                                           self.device).eval().requires_grad_(False)
            self._teacher_key = key
        self._score(self._teacher, samples, prompts or [s.prompt_ids for s in samples], top_k)

    def score_self(self, samples: list[Sample], prompts: list[list[int]], top_k: int = 0, ema: float = 0.0) -> None:
        """The policy itself as the teacher, as it is now (before the step it teaches): it reads `prompts[i]` (the
        sample's prompt with a context the student did not see) followed by the sample's own completion tokens.
        `ema` in (0, 1): the teacher is an exponential moving average of the policy's trained weights (the LoRA
        adapters, or every weight of a full fine-tune) with that decay: the weights at the first call, then moved
        towards the policy by 1 - ema at each call (once per step). It lives with this trainer: a new trainer (a
        restart, a rollback) starts it again from the policy."""
        if not ema:
            self._score(self.model, samples, prompts, top_k)
            return
        if not 0 < ema < 1:
            raise ValueError(f"the EMA teacher's decay must be in (0, 1), got {ema}")
        trained = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        with torch.no_grad():
            if self._ema is None or self._ema[0] != ema:
                self._ema = (ema, {n: p.detach().clone() for n, p in trained})
            else:
                for n, p in trained:
                    self._ema[1][n].lerp_(p.detach(), 1 - ema)
            policy = {n: p.detach().clone() for n, p in trained}
            for n, p in trained:
                p.copy_(self._ema[1][n])
        try:
            self._score(self.model, samples, prompts, top_k)
        finally:
            with torch.no_grad():
                for n, p in trained:
                    p.copy_(policy[n])

    def _score(self, model, samples: list[Sample], prompts: list[list[int]], top_k: int) -> None:
        for s, prompt in zip(samples, prompts, strict=True):  # teacher_scores runs without gradient
            s.teacher_logprobs, ids, lps = teacher_scores(model, prompt, s.completion_ids, top_k,
                                                          self.config.logprob_chunk or 256, self.device)
            if top_k:
                s.teacher_top_ids, s.teacher_top_logprobs = ids, lps

    @torch.no_grad()
    def logprobs(self, samples: list[Sample], base: bool = False) -> list[list[float]]:
        """Each sample's completion-token logprobs under the current policy (no gradient; 0 where the loss mask is
        0); `base`: under the frozen base (base_logprobs)."""
        out = []
        for chunk, batch in self.micro_batches(samples):
            logp = self.base_logprobs(batch) if base else token_logprobs(self.model, batch, self.config.logprob_chunk)
            out += [logp[i, : len(s.completion_ids)].tolist() for i, s in enumerate(chunk)]
        return out

    def critic(self, config: CriticConfig) -> ValueModel:
        return ValueModel(self.model_dir, ValueConfig(lr=config.lr, micro_batch_size=self.config.micro_batch_size),
                          self.init_folder, self.device, self.pad_id)

    def step(self, samples: list[Sample], loss: Loss | SequenceLoss) -> dict:
        """One optimizer step on the recipe's loss: a reef_lab.trainers.base.Loss, divided by the batch's trained
        tokens, or the recipe's own SequenceLoss, divided by its units. A KL penalty (`is` with kl_coef > 0) first
        scores the batch under the frozen base into `Sample.base_logprobs`."""
        if isinstance(loss, SequenceLoss):
            if len(samples) % loss.group:
                raise ValueError(f"loss {loss.name!r} takes samples in groups of {loss.group}; the batch holds "
                                 f"{len(samples)}")
            return self.step_fn(samples, sequence_loss_function(loss), denominator=loss.units(samples),
                                group=loss.group, reference=loss.reference, temperature_one=True)
        if not isinstance(loss, Loss):
            raise TypeError(f"a trainer step takes a Loss or a SequenceLoss, got {type(loss).__name__}")
        fn = loss_function(loss)
        if loss.kind in ("nll", "distill"):  # the model's own distribution, temperature 1 (Loss's docstring)
            samples = [replace(s, temperature=1.0) for s in samples]
        if loss.kind == "is" and loss.kl_coef > 0:
            for s, base in zip(samples, self.logprobs(samples, base=True), strict=True):
                s.base_logprobs = base
        return self.step_fn(samples, fn, top_k=loss.kind == "distill" and divergence(loss.divergence).top_k)

    def step_fn(self, samples: list[Sample], loss_fn: LossFn, denominator: float | None = None, group: int = 1,
                reference: bool = False, temperature_one: bool = False, top_k: bool = False) -> dict:
        """One optimizer step: loss_fn(logp, batch, chunk) -> (loss summed, stats summed) per micro-batch of whole
        groups; the loss is divided by `denominator` (default: the batch's trained tokens). `reference` puts the
        frozen base's logprobs in batch["ref_logprobs"]; `temperature_one` scores at temperature 1 whatever the
        rollouts were sampled at; `top_k` puts the samples' teacher top-K in the batch (a top-K divergence)."""
        started = time.perf_counter()
        total_tokens = sum(s.trained_tokens for s in samples)
        denominator = total_tokens if denominator is None else denominator
        if not denominator > 0:
            raise ValueError(f"the loss's denominator is {denominator}: nothing to train on")
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, stats_total = 0.0, {}
        for chunk, batch in self.micro_batches(samples, group):
            if temperature_one:
                batch["temperature"] = torch.ones_like(batch["temperature"])
            if reference:
                batch["ref_logprobs"] = self.base_logprobs(batch)
            if top_k:
                batch["topk_ids"], batch["teacher_topk"] = losses.teacher_top(chunk, batch["mask"])
            logp = token_logprobs(self.model, batch, self.config.logprob_chunk)
            loss_sum, stats = loss_fn(logp, batch, chunk)
            (loss_sum / denominator).backward()
            loss_total += float(loss_sum.detach())
            for k, v in stats.items():
                stats_total[k] = stats_total.get(k, 0.0) + v
            del logp, loss_sum, batch
            release_memory()  # the micro-batch's freed activations: the next one must not stack on their pages
        grad_norm = _clip(self.params, self.config.max_grad_norm)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"gradient norm is {grad_norm}; step skipped (lower lr or check the data)")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # the gradients are not held between steps
        release_memory()
        self.steps += 1
        return {"loss": loss_total / denominator, "grad_norm": grad_norm, "tokens": total_tokens,
                "samples": len(samples), "units": denominator, "step_s": round(time.perf_counter() - started, 3),
                **stats_total}

    def serving_model(self):
        """The policy as a plain transformers model (LoRA merged into a copy)."""
        if self.config.lora_rank:
            return copy.deepcopy(self.model).merge_and_unload()
        return self.model

    def export(self, folder: str | Path, metadata: dict) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        model = self.serving_model()
        model.save_pretrained(folder)
        if self.config.lora_rank:  # the adapter alone too, for engines that serve releases as LoRA adapters
            self.model.save_pretrained(folder / "adapter")
        self.tokenizer.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(folder)
        meta = {"trainer": "torch", "trainer_config": asdict(self.config), "trainer_step": self.steps,
                "base_model_dir": str(self.model_dir), **metadata}
        stamp_checkpoint(folder, meta)
        return folder


def release_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim; a no-op elsewhere). glibc raises its mmap
    threshold each time it frees an mmapped block, so a step's activations come from its heap arenas, which keep
    their freed pages: without this the process holds a step's peak between steps (measured: 7.0 GB held, 2.5 GB
    after a trim; results/trainer-memory.md)."""
    if _GLIBC is not None:
        _GLIBC.malloc_trim(0)


def fix_mmap_threshold(size: int = 128 * 1024) -> None:
    """Have glibc mmap every block of `size` bytes and more, for good (mallopt M_MMAP_THRESHOLD; a no-op elsewhere or
    where MALLOC_MMAP_THRESHOLD_ is set). Its default threshold rises to the largest block freed so far, after which
    a step's activation tensors come from heap arenas that keep their pages: peak RSS of a GRPO step on 16 tool
    episodes 3.9-4.6 GB with the default, 3.0 GB with this, at the same speed (results/trainer-memory.md)."""
    if _GLIBC is not None and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        _GLIBC.mallopt(-3, size)  # -3: M_MMAP_THRESHOLD (malloc.h)


_GLIBC = ctypes.CDLL("libc.so.6") if sys.platform == "linux" and platform.libc_ver()[0] == "glibc" else None


def _clip(params, max_norm: float) -> float:
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [p.grad.detach().norm() for p in params if p.grad is not None]
    return float(torch.norm(torch.stack(grads))) if grads else 0.0


@dataclass
class ValueConfig:
    lr: float = field(default=1e-5, metadata={"help": "AdamW learning rate of the value model"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the value model's gradient norm"})
    micro_batch_size: int = field(default=8, metadata={"help": "samples per forward/backward"})


class ValueModel(Critic):
    """A critic: the policy's transformer trunk (its own copy) and a scalar head read at the position that
    predicts each completion token, i.e. V(state before token t)."""

    def __init__(self, model_dir: str | Path, config: ValueConfig, init_folder: str | Path | None,
                 device: torch.device, pad_id: int):
        self.config = config
        self.device = device
        self.pad_id = pad_id
        lm = load_causal_lm(model_dir, init_folder, device)
        self.trunk = lm.model if hasattr(lm, "model") else lm.base_model
        self.head = torch.nn.Linear(lm.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        del lm
        self.trunk.train()
        self.params = list(self.trunk.parameters()) + list(self.head.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=config.lr)
        self.updates = 0

    def _values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.trunk(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        index = batch["gather"][..., None].expand(-1, -1, hidden.shape[-1])
        return self.head(hidden.gather(1, index)).squeeze(-1) * batch["mask"]

    @torch.no_grad()
    def values(self, samples: list[Sample]) -> list[list[float]]:
        check_token_ids(samples, self.trunk.get_input_embeddings().num_embeddings)  # a recipe may ask it first
        out = []
        for i in range(0, len(samples), self.config.micro_batch_size):
            chunk = samples[i: i + self.config.micro_batch_size]
            v = self._values(pack(chunk, self.pad_id, self.device))
            out += [v[j, : len(s.completion_ids)].tolist() for j, s in enumerate(chunk)]
        return out

    def update(self, samples: list[Sample], targets: list[list[float]]) -> dict:
        """One step of 0.5 * (V - target)^2, averaged over real tokens. Returns loss and the mean |V - target|
        before the step."""
        check_token_ids(samples, self.trunk.get_input_embeddings().num_embeddings)
        total = sum(s.trained_tokens for s in samples)
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, abs_err = 0.0, 0.0
        for i in range(0, len(samples), self.config.micro_batch_size):
            chunk = samples[i: i + self.config.micro_batch_size]
            batch = pack(chunk, self.pad_id, self.device)
            tgt = torch.zeros_like(batch["mask"])
            for j, s in enumerate(chunk):
                tgt[j, : len(s.completion_ids)] = torch.tensor(targets[i + j], dtype=torch.float32)
            v = self._values(batch)
            err = (v - tgt) * batch["mask"]
            loss = 0.5 * (err ** 2).sum()
            (loss / total).backward()
            loss_total += float(loss.detach())
            abs_err += float(err.detach().abs().sum())
        grad_norm = _clip(self.params, self.config.max_grad_norm)
        self.optimizer.step()
        self.updates += 1
        return {"value_loss": loss_total / total, "value_abs_error": abs_err / total, "value_grad_norm": grad_norm}
