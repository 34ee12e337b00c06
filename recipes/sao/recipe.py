"""`sao`: Single-rollout Asynchronous Optimization (arXiv 2607.07508).

One rollout per prompt, each scored on its own; a scored rollout joins the pool the moment its report arrives and
the next policy step takes the oldest `batch_size` rollouts that are at most `max_staleness` policy steps behind
the trainer (older ones are dropped). With no group to compare against, the baseline is a learned value model:
the first `critic_warmup_steps` batches train only the critic; after that each batch gets `critic_updates` critic
steps per policy step. Value targets are GAE returns with lambda = 1 (the Monte-Carlo return of the sparse final
reward, gamma = 1); the policy's advantages are GAE with the length-adaptive lambda = 1 - 1/(alpha * length),
alpha = 1.5. The policy loss is DIS: the token ratio pi_theta / pi_rollout, with pi_rollout the engine's recorded
logprob, and a two-sided mask that drops tokens whose ratio leaves [0.3, 5.0]; no KL term, no entropy bonus.
Choices the paper leaves open are config fields; their defaults are noted in the help texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.extras import need

need("train", "the sao recipe")
import torch

from reef_lab.learning import rl
from reef_lab.trainers import losses
from reef_lab.learning.learner import WeightRecipe
from reef_lab.learning.recipe import LearnConfig, require_score
from reef_lab.trainers.samples import Sample
from reef_lab.trainers import make_trainer
from reef_lab.trainers.base import Critic, CriticConfig, Loss, Trainer


@dataclass
class SAOConfig(LearnConfig):
    batch_size: int = field(default=16, metadata={"client_max": 1024, "help": "rollouts per policy step"})
    max_staleness: int = field(default=4, metadata={
        "help": "most policy steps a rollout may lag the trainer (bounded staleness; not fixed by the paper)"})
    critic_warmup_steps: int = field(default=4, metadata={
        "help": "batches that train only the value model before the first policy step (count not fixed by "
                "the paper)"})
    critic_updates: int = field(default=2, metadata={"client_max": 64,
        "help": "value-model steps per policy step (paper: 2)"})
    critic_lr: float = field(default=1e-5, metadata={"help": "value model learning rate"})
    gamma: float = field(default=1.0, metadata={"help": "discount (paper: 1)"})
    value_lambda: float = field(default=1.0, metadata={"help": "GAE lambda of the value targets (paper: 1)"})
    lambda_alpha: float = field(default=1.5, metadata={
        "help": "policy GAE lambda = 1 - 1/(alpha * response length) (paper: alpha 1.5)"})
    dis_low: float = field(default=0.3, metadata={"help": "drop tokens with pi_theta/pi_rollout below this (paper)"})
    dis_high: float = field(default=5.0, metadata={"help": "drop tokens with pi_theta/pi_rollout above this (paper)"})
    normalize_advantages: bool = field(default=False, metadata={
        "help": "whiten advantages over the batch (off: the value model is the baseline)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1 or self.critic_updates < 1 or self.critic_warmup_steps < 0:
            raise ValueError("batch_size and critic_updates must be >= 1, critic_warmup_steps >= 0")
        if not 0 < self.dis_low < 1 < self.dis_high:
            raise ValueError("the DIS interval needs 0 < dis_low < 1 < dis_high")


class SAOTrainer:
    """The policy and its value model (both from the backend the config's `trainer` names)."""

    def __init__(self, policy: Trainer, critic: Critic):
        self.policy, self.critic = policy, critic
        self.warmup_done = 0

    @property
    def steps(self) -> int:
        return self.policy.steps

    @steps.setter
    def steps(self, value: int) -> None:
        self.policy.steps = value

    def export(self, folder, metadata):
        return self.policy.export(folder, metadata)


def advantages_and_targets(samples: list[Sample], values: list[list[float]], cfg: SAOConfig):
    """Per sample: policy advantages (length-adaptive lambda) and value targets (lambda = value_lambda).

    Over the generated tokens only (the loss mask's 1s): an episode's tool results and template tokens are the
    environment's move between two of the model's, so GAE runs over the model's tokens laid end to end, the length
    in the adaptive lambda counts only them, and the advantages are normalised over them; given tokens get 0."""
    where = [[t for t, m in enumerate(s.mask) if m] for s in samples]
    n = max(len(w) for w in where)
    mask = torch.zeros(len(samples), n)
    v = torch.zeros(len(samples), n)
    for i, (vs, w) in enumerate(zip(values, where, strict=True)):
        mask[i, : len(w)] = 1
        v[i, : len(w)] = torch.tensor([vs[t] for t in w])
    rewards = rl.terminal_rewards(torch.tensor([s.score for s in samples]), mask)
    lengths = mask.sum(dim=1)
    adv = rl.gae(rewards, v, mask, cfg.gamma, rl.length_adaptive_lambda(lengths, cfg.lambda_alpha))
    targets = rl.gae(rewards, v, mask, cfg.gamma, cfg.value_lambda) + v
    if cfg.normalize_advantages:
        real = adv[mask.bool()]
        adv = (adv - real.mean()) / (real.std() + 1e-6) * mask
    return _spread(adv, where, samples), _spread(targets, where, samples)


def _spread(compact: torch.Tensor, where: list[list[int]], samples: list[Sample]) -> list[list[float]]:
    """Rows over the generated tokens back to rows over every completion token (0 where the mask is 0)."""
    out = []
    for i, (w, s) in enumerate(zip(where, samples, strict=True)):
        row = [0.0] * len(s.completion_ids)
        for j, t in enumerate(w):
            row[t] = float(compact[i, j])
        out.append(row)
    return out


class SAORecipe(WeightRecipe):
    name = "sao"

    def __init__(self, **config):
        self.config = SAOConfig(**config)

    def validate_report(self, report: dict) -> None:
        require_score(self.name, report)

    def accepts(self, sample: Sample) -> bool:
        return sample.score is not None and sample.logprobs is not None

    def _fresh(self, pool, step, release_steps):
        return rl.split_by_staleness(pool, step, release_steps, self.config.max_staleness)

    def ready(self, pool, trainer_step, release_steps) -> bool:
        return len(self._fresh(pool, trainer_step, release_steps)[0]) >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        fresh, stale = self._fresh(pool, trainer_step, release_steps)
        return fresh[: self.config.batch_size], stale

    def make_trainer(self, model_dir, init_folder):
        policy = make_trainer(self.config.trainer, model_dir, init_folder)
        return SAOTrainer(policy, policy.critic(CriticConfig(lr=self.config.critic_lr)))

    def train(self, trainer: SAOTrainer, batch: list[Sample]) -> dict:
        cfg = self.config
        values = trainer.critic.values(batch)
        adv, targets = advantages_and_targets(batch, values, cfg)
        reward = sum(s.score for s in batch) / len(batch)
        if trainer.warmup_done < cfg.critic_warmup_steps:
            trainer.warmup_done += 1
            m = trainer.critic.update(batch, targets)
            return {**m, "policy_step": False, "phase": "critic_warmup", "reward_mean": reward,
                    "samples": len(batch)}
        updates = [trainer.critic.update(batch, targets) for _ in range(cfg.critic_updates)]
        critic_metrics = {**updates[-1], "value_abs_error": updates[0]["value_abs_error"]}  # before this batch
        for s, a in zip(batch, adv, strict=True):
            s.advantages = a
        m = trainer.policy.step(batch, Loss("dis", cfg.dis_low, cfg.dis_high))
        flat = [a for row, s in zip(adv, batch) for a, on in zip(row, s.mask) if on]
        return {**m, **losses.dis_metrics(m), **critic_metrics, "policy_step": True, "phase": "policy",
                "reward_mean": reward, "advantage_mean": sum(flat) / len(flat)}
