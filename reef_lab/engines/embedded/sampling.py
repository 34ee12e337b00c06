"""From logits to a token and from tokens to text: the embedded engine's sampling and its incremental
detokenisation, one row at a time.

Token accounting: `token_ids`/`logprobs` hold every sampled token that produced returned text. An EOS token is kept
there (training needs the model to learn to stop) but never appears in `text`. When a stop string ends the text, the
tokens lying wholly inside it, including the one that completed it, are dropped; a token that straddles the boundary
(part returned text, part stop string) is kept, so `decode(token_ids)` starts with `text` and covers nothing past it
but that token's tail.
"""

from __future__ import annotations

import bisect

import torch

from reef_lab.engines.base import SamplingParams


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, float]:
    """Pick the next token from one row's logits [V]; return it with its logprob under the sampling
    distribution (log_softmax(logits / temperature) before top-p; raw log_softmax when temperature is 0)."""
    logits = logits.float()
    if params.temperature == 0:
        token = int(logits.argmax())
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    logprobs = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logprobs.exp()
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set whose probability mass reaches top_p (the top token is kept)."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def check_params(params: SamplingParams) -> None:
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}")
    if not params.temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 is greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"stop must be a list of non-empty strings, got {params.stop!r}")


class TextTracker:
    """Turns one row's generated token ids into text deltas.

    Deltas never end inside a UTF-8 character (a piece that decodes to U+FFFD waits for the next token) and never
    reach into a stop string: the longest suffix of the text that could start a stop string is held back until the
    next token rules it in or out. `text_ends[i]` is the text length once token i was decoded; it maps the stop
    string's position back to the tokens that produced the returned text.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self._tokenizer = tokenizer
        self._stop = [s for s in stop if s]
        self._longest_stop = max((len(s) for s in self._stop), default=0)
        self.ids: list[int] = []
        self.text = ""
        self.text_ends: list[int] = []
        self.emitted = 0
        self.stop_at: int | None = None
        self.stop_sequence: str | None = None
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _new_piece(self, final: bool) -> str:
        prefix = self._decode(self.ids[self._prefix_offset : self._read_offset])
        text = self._decode(self.ids[self._prefix_offset :])
        if len(text) > len(prefix) and (final or not text.endswith("\ufffd")):
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""

    def add(self, token_id: int) -> str:
        """Take one generated token; return the text that may now be shown. Sets `stop_at` on a stop string."""
        self.ids.append(token_id)
        search_from = max(0, len(self.text) - self._longest_stop + 1)
        self.text += self._new_piece(final=False)
        self.text_ends.append(len(self.text))
        self._find_stop(search_from)
        end = self.stop_at if self.stop_at is not None else len(self.text) - self._held_back()
        return self._emit(end)

    def finish(self) -> str:
        """The generation ended without a stop string: release held-back and undecodable text."""
        self.text += self._new_piece(final=True)
        if self.text_ends:
            self.text_ends[-1] = len(self.text)
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta

    def _find_stop(self, search_from: int) -> None:
        found = [(self.text.find(s, search_from), len(s), s) for s in self._stop]
        found = [f for f in found if f[0] >= 0]
        if found:
            self.stop_at, _, self.stop_sequence = min(found)

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        for length in range(min(self._longest_stop - 1, len(self.text)), 0, -1):
            suffix = self.text[-length:]
            if any(s.startswith(suffix) for s in self._stop):
                return length
        return 0

    def tokens_before_stop(self) -> int:
        """How many tokens to keep once a stop string was found: those that put any character of the returned
        text (the text before the stop string) into place; tokens lying wholly inside the stop string (including
        the one that completed it) are dropped. A token that straddles the boundary is kept."""
        if not self.stop_at:
            return 0
        return bisect.bisect_left(self.text_ends, self.stop_at) + 1

    @property
    def returned_text(self) -> str:
        return self.text if self.stop_at is None else self.text[: self.stop_at]
