"""The advantages of policy-gradient training, as plain tensor functions that tests check by hand.

Recipes compose these: SAO (one rollout per prompt, a learned value model, GAE advantages with a length-adaptive
lambda, the DIS loss), GRPO (a group baseline instead of the value model, the same DIS loss) and SFT (token NLL).
The token losses these advantages feed (nll, dis, is) live with the trainers: reef_lab/trainers/losses.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reef_lab.extras import need

need("train", "the RL advantages")
import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: torch.Tensor | float) -> torch.Tensor:
    """Generalised advantage estimates per token.

    rewards, values, mask: [B, T]; `values[b, t]` is V(state before token t); the state after the last real token is
    terminal (value 0). `lam` is a float or a [B] tensor (one lambda per sequence, e.g. length-adaptive).
    A_t = sum_k (gamma * lam)^k delta_{t+k}, delta_t = r_t + gamma V_{t+1} - V_t.
    """
    B, T = rewards.shape
    lam_b = torch.as_tensor(lam, dtype=values.dtype, device=values.device).expand(B) if not (
        isinstance(lam, torch.Tensor) and lam.dim() == 1) else lam.to(values.dtype)
    mask = mask.to(values.dtype)
    adv = torch.zeros_like(values)
    running = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    for t in range(T - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam_b * running) * m
        adv[:, t] = running
        next_value = values[:, t] * m  # past the end (padding) the next value is the terminal 0
    return adv


def length_adaptive_lambda(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """lambda = 1 - 1 / (alpha * length): long responses get lambda near 1 (little bias where the value model's
    error would compound), short ones rely more on the value model. Clamped at 0 for length < 1/alpha."""
    return (1.0 - 1.0 / (alpha * lengths.to(torch.float64).clamp(min=1))).clamp(min=0.0).to(torch.float32)


def terminal_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] scores placed on each sequence's last real token; zero elsewhere."""
    rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    last = mask.long().sum(dim=1) - 1
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows[last >= 0], last[last >= 0]] = scores[last >= 0].float()
    return rewards


def group_advantages(scores: list[float], groups: list[str], eps: float = 1e-6,
                     scale: bool = True) -> list[float]:
    """GRPO's baseline: each score minus its group's mean, divided by the group's std (population) + eps when
    `scale`. A group whose scores are all equal yields zeros (it carries no signal)."""
    by: dict[str, list[float]] = {}
    for s, g in zip(scores, groups, strict=True):
        by.setdefault(g, []).append(s)
    stats = {}
    for g, xs in by.items():
        mean = sum(xs) / len(xs)
        std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
        stats[g] = (mean, std)
    out = []
    for s, g in zip(scores, groups, strict=True):
        mean, std = stats[g]
        out.append((s - mean) / (std + eps) if scale else s - mean)
    return out


def within_staleness(rollout_step: int, trainer_step: int, max_staleness: int) -> bool:
    """A rollout made by the policy of trainer step `rollout_step` may join the update at `trainer_step` while the
    policy has moved at most `max_staleness` steps since (0: strictly on-policy)."""
    return 0 <= trainer_step - rollout_step <= max_staleness


def split_by_staleness(pool: list, trainer_step: int, release_steps: dict[str, int],
                       max_staleness: int) -> tuple[list, list]:
    """(fresh, stale) samples of a pool, in pool order; a sample's policy step is its release's trainer step."""
    fresh, stale = [], []
    for s in pool:
        ok = within_staleness(release_steps.get(s.release_id, 0), trainer_step, max_staleness)
        (fresh if ok else stale).append(s)
    return fresh, stale


class FreshBatches:
    """`ready` / `build_batch` of a recipe that trains on the pool's first `batch_size` samples within
    `max_staleness` policy steps of the trainer (older ones are dropped): opd, sdft. Reads config.batch_size and
    config.max_staleness."""

    def _fresh(self, pool, trainer_step, release_steps):
        return split_by_staleness(pool, trainer_step, release_steps, self.config.max_staleness)

    def ready(self, pool, trainer_step, release_steps) -> bool:
        return len(self._fresh(pool, trainer_step, release_steps)[0]) >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        fresh, stale = self._fresh(pool, trainer_step, release_steps)
        return fresh[: self.config.batch_size], stale


class GroupBatches(FreshBatches):
    """The same for a recipe that compares `group_size` rollouts of one prompt (their `group`): a batch is whole
    groups, batch_size // group_size of them (grpo, sdpo)."""

    def _groups(self, fresh):
        groups: dict = {}
        for s in fresh:
            groups.setdefault(s.group, []).append(s)
        return [g[: self.config.group_size] for g in groups.values() if len(g) >= self.config.group_size]

    def ready(self, pool, trainer_step, release_steps) -> bool:
        fresh, _ = self._fresh(pool, trainer_step, release_steps)
        return len(self._groups(fresh)) * self.config.group_size >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        fresh, stale = self._fresh(pool, trainer_step, release_steps)
        groups = self._groups(fresh)[: self.config.batch_size // self.config.group_size]
        return [s for g in groups for s in g], stale


@dataclass
class GroupConfig:
    """The config of a recipe that compares groups of rollouts with the DIS loss (grpo, sdpo): mixed in before its
    LearnConfig base, whose checks run first."""

    group_size: int = field(default=4, metadata={"client_max": 64, "help": "rollouts per prompt (G)"})
    batch_size: int = field(default=16, metadata={"client_max": 1024,
        "help": "rollouts per policy step (a multiple of group_size)"})
    scale_by_std: bool = field(default=True, metadata={"help": "divide the centred score by the group's std"})
    dis_low: float = field(default=0.3, metadata={"help": "drop tokens with pi_theta/pi_rollout below this"})
    dis_high: float = field(default=5.0, metadata={"help": "drop tokens with pi_theta/pi_rollout above this"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2 or self.batch_size % self.group_size:
            raise ValueError("group_size must be >= 2 and batch_size a multiple of it")
        if not 0 < self.dis_low < 1 < self.dis_high:
            raise ValueError("the DIS interval needs 0 < dis_low < 1 < dis_high")
