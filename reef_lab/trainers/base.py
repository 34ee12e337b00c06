"""The Trainer protocol: what a weight recipe asks of whatever trains its policy.

A recipe hands a trainer a batch of samples and its loss *as data* (`Loss`: which objective, its constants; per-token
advantages ride on the samples as `Sample.advantages`), never a closure over one trainer's tensors, so the
in-process torch trainer and a distributed backend run the same recipe unchanged. A trainer reports the current
policy's logprobs (and the frozen base's, for a KL term), exports a candidate as a Hugging Face folder the engines
load, and starts from a release's weights (`init_folder`) to resume a scenario. Critics (SAO's value model) come
from the same backend (`critic`).

`TrainerConfig.backend` names the class (reef_lab.trainers: a short name or a `module:Class` path, an operator's
choice, never a client's); the backend owns its settings: `TrainerConfig.options` is a mapping the backend's
`check_config` validates when the config is built (the slime backend's are reef_lab.trainers.slime.SlimeConfig), so
this module names no backend and a new one edits nothing here.

A recipe may also bring an objective of its own (`SequenceLoss`: a function of each sequence's per-token logprobs
under the policy and, if it asks, under the frozen reference) without a core edit. Only a backend that runs the
recipe's code next to its policy can take one (`SequenceLossTrainer`: the torch trainer); a recipe that brings one
calls `require_sequence_losses(config.trainer, ...)` when it is configured, so a backend that cannot (slime, whose
loss is fixed when its job launches) is refused at scenario creation or experiment start, not at the first step.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reef_lab.trainers.divergences import divergence
from reef_lab.trainers.samples import InvalidSamples, Sample
from reef_lab.schema import check_fields

LOSSES = ("nll", "dis", "is", "distill")


@dataclass(frozen=True)
class Loss:
    """A policy loss, summed over completion tokens and divided by the batch's real-token count by the trainer.

    - `nll`: negative log-likelihood of the completion under the model's own distribution, temperature 1, whatever
      temperature sampled it (SFT imitates the text, not the sampler: the engine applies the serving temperature
      when it samples, so training the tempered distribution would apply it twice);
    - `dis`: the DIS policy gradient: token ratio pi_theta / pi_rollout (the engine's recorded logprob) times the
      sample's per-token advantage, tokens whose ratio leaves [dis_low, dis_high] masked out (SAO, GRPO);
    - `is`: unclipped importance sampling, -rho * (A - kl_coef * sg(log pi_theta - log pi_base)) per token with
      rho = pi_theta / pi_rollout: every token kept, and a KL penalty towards the frozen base (its gradient is the
      token-level reverse-KL gradient; base logprobs from the trainer, LoRA adapters off) (TTT-Discover);
    - `distill`: a divergence from a teacher's logprobs on the student's own tokens, at temperature 1
      (reef_lab.trainers.losses): `reverse_kl` (on-policy distillation: the sampled token, the importance ratio to
      the rollout's policy truncated at `is_cap`; needs Sample.teacher_logprobs), `forward_kl` or `jsd` (over the
      teacher's top-K tokens at each position, `jsd_beta` its weight on the teacher; needs Sample.teacher_top_ids
      and teacher_top_logprobs).
    """

    kind: str
    dis_low: float = 0.3
    dis_high: float = 5.0
    kl_coef: float = 0.0
    divergence: str = "reverse_kl"
    is_cap: float = 2.0
    jsd_beta: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in LOSSES:
            raise ValueError(f"loss kind must be one of {LOSSES}, got {self.kind!r}")
        if self.kind == "dis" and not 0 < self.dis_low < 1 < self.dis_high:
            raise ValueError("the DIS interval needs 0 < dis_low < 1 < dis_high")
        if not (self.kl_coef >= 0 and self.kl_coef != float("inf")):
            raise ValueError(f"kl_coef must be a finite number >= 0, got {self.kl_coef}")
        if self.kl_coef and self.kind != "is":
            raise ValueError(f"kl_coef is part of the 'is' loss only; loss {self.kind!r} would ignore it")
        divergence(self.divergence)  # ValueError naming the table's divergences
        if not (self.is_cap >= 1 and self.is_cap != float("inf")):
            raise ValueError(f"is_cap must be a finite number >= 1 (the largest importance ratio kept), got "
                             f"{self.is_cap}")
        if not 0 < self.jsd_beta < 1:
            raise ValueError(f"jsd_beta must be in (0, 1), got {self.jsd_beta}")


class SequenceLoss(ABC):
    """A recipe's own objective over whole sequences (e.g. DPO's over pairs), run by a SequenceLossTrainer.

    Per micro-batch the trainer calls `loss(logp, mask, samples, ref_logp)` with
    - `logp`: [B, T] torch tensor, each completion token's logprob under the policy at temperature 1 (with gradient;
      0 where the mask is 0 and on padding),
    - `mask`: [B, T] the loss mask (1 on tokens the model generated; reef_lab.trainers.samples),
    - `samples`: the micro-batch's Samples in batch order (the recipe's per-sample data rides in `extra`),
    - `ref_logp`: [B, T] the same under the frozen reference (the base model: LoRA adapters off, or a frozen copy of
      the base for a full fine-tune), no gradient; None unless `reference` is True,
    and takes back `(loss_sum, stats)`: the loss summed over the micro-batch's units (pairs, sequences, ...) as a
    0-dim tensor, and float counters summed likewise. The trainer divides by `units(batch)` of the whole batch, so
    micro-batching never changes the update, and keeps every `group` consecutive samples in one micro-batch.
    """

    name: str = "sequence"
    group: int = 1  # consecutive samples that must share a micro-batch (2: a DPO pair)
    reference: bool = False  # whether the trainer must supply the frozen reference's logprobs

    def units(self, samples: list[Sample]) -> float:
        """What the summed loss is divided by: by default one unit per group of samples."""
        return len(samples) / self.group

    @abstractmethod
    def __call__(self, logp, mask, samples: list[Sample], ref_logp) -> tuple:
        """(loss summed over this micro-batch's units, stats summed)."""


@dataclass
class TrainerConfig:
    lr: float = field(default=1e-5, metadata={"help": "AdamW learning rate of the policy"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": "AdamW betas"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "clip the gradient's global norm (0: off)"})
    micro_batch_size: int = field(default=8, metadata={"client_max": 64,
        "help": "samples per forward/backward; gradients accumulate over the batch"})
    micro_batch_tokens: int = field(default=0, metadata={
        "help": "torch backend: at most this many prompt+completion positions per forward/backward (whole groups; "
                "a longer group runs alone); the activations a backward keeps grow with them. 0: no limit",
        "operator": True})
    logprob_chunk: int = field(default=256, metadata={
        "help": "torch backend: trained positions whose vocabulary-wide logits exist at once (recomputed in the "
                "backward pass instead of kept); 0: every position's logits of a micro-batch at once (more memory)",
        "operator": True})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "torch backend: keep only each decoder layer's input for the backward pass and recompute the layer "
                "there: about a third more compute, a micro-batch's activations ~20x smaller (a client may set it: it "
                "only trades compute for memory)"})
    lora_rank: int = field(default=0, metadata={"client_max": 256,
        "help": "0: full fine-tune; >0: LoRA adapters of this rank (peft)"})
    lora_alpha: float = field(default=32.0, metadata={"help": "LoRA scaling alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"],
                                    metadata={"help": "module names LoRA adapts"})
    device: str = field(default="auto", metadata={"operator": True, "help": "auto (cuda if present), cpu or cuda"})
    seed: int = field(default=0, metadata={"help": "torch seed for dropout and LoRA init"})
    backend: str = field(default="torch", metadata={
        "help": "the trainer: torch (reef_lab.trainers.torch_trainer, in-process, CPU or CUDA), slime "
                "(reef_lab.trainers.slime: a slime job on NVIDIA GPUs, see docs/slime.md) or a module:Class path of "
                "a reef_lab.trainers.base.Trainer", "operator": True, "code": True})
    options: dict = field(default_factory=dict, metadata={
        "help": "the backend's own settings, validated by the backend (slime: reef_lab.trainers.slime.SlimeConfig: "
                "slime checkout, spool and save folders, Megatron model args, GPUs; torch: none)", "operator": True})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.lr <= 0 or self.micro_batch_size < 1 or self.lora_rank < 0:
            raise ValueError("lr must be > 0, micro_batch_size >= 1 and lora_rank >= 0")
        if self.micro_batch_tokens < 0 or self.logprob_chunk < 0:
            raise ValueError("micro_batch_tokens and logprob_chunk must be >= 0 (0: no limit, all at once)")
        if len(self.betas) != 2:
            raise ValueError("betas needs two values, e.g. [0.9, 0.999]")
        from reef_lab.trainers import check_backend_config  # the backend, resolved now: a wrong name fails at start

        check_backend_config(self)

    # The mapping interface of the versions where this config was a dict (`trainer.get("lr")`, `trainer["lr"]`),
    # kept so a plug-in recipe written then still runs; it warns once per call site.
    def get(self, key: str, default: Any = None) -> Any:
        _warn_mapping_use()
        return asdict(self).get(key, default)

    def __getitem__(self, key: str) -> Any:
        _warn_mapping_use()
        return asdict(self)[key]


def _warn_mapping_use() -> None:
    warnings.warn("the trainer config is a reef_lab.trainers.base.TrainerConfig dataclass now: read its attributes "
                  "(config.trainer.lr); its dict interface (get, []) will go in a later version",
                  DeprecationWarning, stacklevel=3)


@dataclass
class CriticConfig:
    lr: float = field(default=1e-5, metadata={"help": "value model learning rate"})


class Critic(ABC):
    """A value model beside the policy: per completion token, the expected final reward."""

    @abstractmethod
    def values(self, samples: list[Sample]) -> list[list[float]]: ...

    @abstractmethod
    def update(self, samples: list[Sample], targets: list[list[float]]) -> dict:
        """One optimizer step towards the targets; metrics (value_loss, value_abs_error before the step)."""


def check_token_ids(samples: list[Sample], vocab: int) -> None:
    """InvalidSamples naming every sample with a prompt or completion id outside [0, vocab), the first such id's
    field and position: checked before any id reaches an embedding table (on CUDA an out-of-range lookup is a
    device-side assert after which every CUDA call of the process fails)."""
    errors = {}
    for s in samples:
        for name, ids in (("prompt_ids", s.prompt_ids), ("completion_ids", s.completion_ids)):
            if ids and (min(ids) < 0 or max(ids) >= vocab):
                k = next(k for k, t in enumerate(ids) if not 0 <= t < vocab)
                errors[s.record_id] = (f"{name}[{k}] = {ids[k]} is outside the model's vocabulary 0..{vocab - 1} "
                                       "(token ids from another tokenizer?)")
                break
    if errors:
        raise InvalidSamples(f"{len(errors)} sample(s) hold token ids outside the model's vocabulary: " + "; ".join(
            f"{rid}: {why}" for rid, why in list(errors.items())[:5]), errors)


class Trainer(ABC):
    """The policy being trained. `steps` counts policy steps taken (a scenario's releases remember theirs)."""

    steps: int

    @abstractmethod
    def __init__(self, model_dir: str | Path, config: TrainerConfig, init_folder: str | Path | None = None):
        """Load the base model in `model_dir`, with a release's weights from `init_folder` when given."""

    @abstractmethod
    def step(self, samples: list[Sample], loss: Loss) -> dict:
        """One optimizer step; metrics (loss, grad_norm, tokens, samples, and the loss's own counters)."""

    @abstractmethod
    def logprobs(self, samples: list[Sample], base: bool = False) -> list[list[float]]:
        """Completion-token logprobs under the current policy (`base`: under the frozen starting weights)."""

    @abstractmethod
    def export(self, folder: str | Path, metadata: dict) -> Path:
        """Write the policy as a Hugging Face model folder stamped with `metadata` (reef_lab.checkpoints)."""

    @abstractmethod
    def critic(self, config: CriticConfig) -> Critic:
        """A value model on the same base and device (recipes with a learned baseline)."""

    @classmethod
    def check_config(cls, config: TrainerConfig) -> None:
        """Refuse a config this backend cannot run (ValueError naming the field and the fix), its `options`
        included; called when the config is built. By default a backend takes no options."""
        if config.options:
            raise ValueError(f"trainer.options {sorted(config.options)}: backend {config.backend!r} takes no "
                             "options of its own")


class DistillTrainer(Trainer):
    """A trainer that scores samples under a frozen teacher (the distillation recipes, reef_lab/learning/distill.py)."""

    @abstractmethod
    def score_teacher(self, samples: list[Sample], teacher_dir: str | Path | None,
                      teacher_release: str | Path | None = None, top_k: int = 0,
                      prompts: list[list[int]] | None = None) -> None:
        """Fill each sample's teacher_logprobs (and with `top_k` its teacher_top_ids / teacher_top_logprobs): the
        teacher reads `prompts[i]` (default: the sample's prompt) then the sample's own completion tokens."""

    @abstractmethod
    def score_self(self, samples: list[Sample], prompts: list[list[int]], top_k: int = 0, ema: float = 0.0) -> None:
        """The same, with the policy as it is now as the teacher (self-distillation: `prompts` hold a context the
        student did not see); `ema` in (0, 1): an exponential moving average of the policy's weights instead."""


class SequenceLossTrainer(Trainer):
    """A trainer that also runs a recipe's own SequenceLoss: `step(samples, loss)` takes a Loss or a SequenceLoss."""

    @abstractmethod
    def step(self, samples: list[Sample], loss: Loss | SequenceLoss) -> dict:
        """One optimizer step on a Loss, or on a SequenceLoss (metrics: loss, grad_norm, tokens, samples, units
        and the loss's own counters)."""


def require_sequence_losses(config: TrainerConfig | dict, recipe: str) -> None:
    """Refuse, when a recipe is configured, a trainer backend that cannot run the recipe's own SequenceLoss."""
    from reef_lab.trainers import trainer_class  # the backend table lives there; it imports this module

    cfg = config if isinstance(config, TrainerConfig) else TrainerConfig(**config)
    klass = trainer_class(cfg.backend)
    if not issubclass(klass, SequenceLossTrainer):
        raise ValueError(
            f"recipe {recipe!r} trains on a loss of its own (a reef_lab.trainers.base.SequenceLoss), which trainer "
            f"backend {cfg.backend!r} ({klass.__module__}.{klass.__name__}) cannot run: it takes only the built-in "
            f"losses {LOSSES}. Use trainer.backend torch")
