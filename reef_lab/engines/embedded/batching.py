"""The embedded engine's scheduler state: running batches, prompts being prefilled in chunks, and the pacer that
sizes those chunks.

They live apart from the scheduler's loop (scheduler.py) because they are the part that decides fairness: a long
prompt is prefilled a chunk per scheduler round, its KV cache kept between rounds, while the other requests keep
decoding; `PrefillPacer` sizes each chunk so that the long prompt takes at most a set share of the engine's time
while others wait on it (docs/embedded-engine.md#long-prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from reef_lab.engines.base import SamplingParams
    from reef_lab.engines.embedded.sampling import TextTracker
    from reef_lab.engines.embedded.stream import EmbeddedStream


@dataclass(eq=False)
class Row:
    """Scheduler-side state of one sequence."""

    stream: EmbeddedStream
    params: SamplingParams
    max_tokens: int
    release_id: str  # the loaded release (model) this row decodes with
    generator: torch.Generator
    text: TextTracker
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass(eq=False)
class Prefill:
    """A prompt prefilled over several rounds: `cache` holds the KV of its first `done` tokens (batch of one, no
    padding), so each chunk attends to everything before it and the result equals a single-shot prefill."""

    row: Row
    cache: object  # transformers DynamicCache
    done: int = 0

    @property
    def prompt_ids(self) -> list[int]:
        return self.row.stream.prompt_ids

    @property
    def left(self) -> int:
        return len(self.prompt_ids) - self.done


@dataclass
class Batch:
    """A running batch: KV cache rows are left-padded to a common length; `mask` marks real positions,
    `positions` is each row's next position id, `next_tokens` the sampled tokens not yet fed to the model."""

    rows: list[Row]
    cache: object  # transformers DynamicCache
    mask: torch.Tensor  # [B, T] long
    positions: torch.Tensor  # [B] long
    next_tokens: torch.Tensor  # [B] long

    def keep(self, indices: list[int]) -> None:
        index = torch.tensor(indices, dtype=torch.long, device=self.mask.device)
        self.rows = [self.rows[i] for i in indices]
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.mask, self.positions, self.next_tokens = self.mask[index], self.positions[index], self.next_tokens[index]
        self._trim()

    def _trim(self) -> None:
        """Drop leading columns that are padding in every row (left behind by rows that left)."""
        real = self.mask.any(dim=0).nonzero()
        drop = int(real[0]) if len(real) else self.mask.shape[1]
        if drop:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, drop:], layer.values[:, :, drop:]
            self.mask = self.mask[:, drop:]

    def merge(self, other: Batch) -> None:
        length = max(self.mask.shape[1], other.mask.shape[1])
        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([_left_pad(mine.keys, length, 2), _left_pad(theirs.keys, length, 2)])
            mine.values = torch.cat([_left_pad(mine.values, length, 2), _left_pad(theirs.values, length, 2)])
        self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(other.mask, length, 1)])
        self.positions = torch.cat([self.positions, other.positions])
        self.next_tokens = torch.cat([self.next_tokens, other.next_tokens])
        self.rows += other.rows


def _left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


@dataclass
class PrefillPacer:
    """How many prompt tokens the next chunk of a long prompt takes.

    While no other request is in progress (and none was in the last `quiet_rounds` rounds nor `quiet_s`
    seconds), a chunk is `chunk` tokens: the prompt goes as fast as the hardware allows. While others are (decode
    steps, short prompts' prefill), the chunk is sized to take `share / (1 - share)` times the time their work took
    in a round (a running average), using the prefill speed measured on the recent such chunks: so the long prompt
    gets about `share` of the engine's time and the others run at `1 - share` of their speed or better. It never
    goes below `min_chunk` tokens, so a long prompt always progresses. The quiet period covers the moment between
    one wave of short requests ending and the next arriving (a client's next request comes a round trip later),
    when a full-size chunk would make them wait for it.
    """

    chunk: int
    share: float
    min_chunk: int = 16
    quiet_s: float = 1.0
    quiet_rounds: int = 3
    smoothing: float = 0.5
    rate: float | None = None  # tokens per second of recent chunks sized for sharing
    other_s: float | None = None  # the others' work per round (running average)
    last_busy: float = -math.inf
    rounds_since_busy: int = 1 << 30

    def round_done(self, other_s: float, busy: bool, now: float) -> None:
        """A round ended: `other_s` seconds went to other requests' work; `busy` when there was any."""
        if busy:
            self.last_busy, self.rounds_since_busy = now, 0
            self.other_s = other_s if self.other_s is None else self._mix(self.other_s, other_s)
        else:
            self.rounds_since_busy += 1

    def sharing(self, now: float) -> bool:
        recent = self.rounds_since_busy <= self.quiet_rounds or now - self.last_busy <= self.quiet_s
        return self.share < 1 and self.other_s is not None and recent

    def size(self, now: float) -> int:
        if not self.sharing(now):
            return self.chunk
        if self.rate is None:
            return self.min_chunk
        target = self.other_s * self.share / (1 - self.share)
        return max(self.min_chunk, min(self.chunk, int(target * self.rate)))

    def chunk_done(self, tokens: int, seconds: float, shared: bool) -> None:
        """A chunk of `tokens` took `seconds`; `shared` when it was sized for sharing (only those teach the rate:
        the speed of a full-size chunk says little about a small one's)."""
        if shared and seconds > 0:
            rate = tokens / seconds
            self.rate = rate if self.rate is None else self._mix(self.rate, rate)

    def _mix(self, old: float, new: float) -> float:
        return (1 - self.smoothing) * old + self.smoothing * new
