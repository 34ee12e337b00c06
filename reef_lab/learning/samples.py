"""Samples: what trainers learn from. A sample is one scored generation, taken from the records.

An inference record holds the prompt's token ids, the generated token ids and the engine's logprob of each (under
the sampling temperature) and the release that produced them; a report referencing it adds the score (and for GRPO
its group comes from the `x-reef-tag-group` header). Demonstrations for SFT are `train` records whose request
holds chat messages and whose response holds the target text.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    record_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None  # the serving engine's logprob of each completion token
    score: float | None
    release_id: str
    temperature: float = 1.0
    group: str | None = None
    created_at: float = 0.0
    report_id: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.completion_ids:
            raise ValueError(f"sample {self.record_id}: no completion tokens")
        if self.logprobs is not None and len(self.logprobs) != len(self.completion_ids):
            raise ValueError(f"sample {self.record_id}: {len(self.logprobs)} logprobs for "
                             f"{len(self.completion_ids)} tokens")


def sample_from_records(inference: dict, report: dict) -> Sample | None:
    """The sample an inference record and a report on it make; None when the record cannot train weights
    (relayed upstream, failed, or without token ids)."""
    if inference.get("status") != "ok" or not inference.get("token_ids") or not inference.get("prompt_token_ids"):
        return None
    request = inference.get("request") or {}
    temperature = request.get("temperature", 1.0) if isinstance(request, dict) else 1.0
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        temperature = 1.0  # greedy rollouts: the engine recorded raw log_softmax, i.e. temperature 1
    return Sample(record_id=inference["id"], prompt_ids=list(inference["prompt_token_ids"]),
                  completion_ids=list(inference["token_ids"]), logprobs=inference.get("logprobs"),
                  score=report.get("score"), release_id=inference.get("release_id") or "base",
                  temperature=float(temperature), group=(inference.get("tags") or {}).get("group"),
                  created_at=inference.get("created_at") or 0.0, report_id=report.get("id"))
