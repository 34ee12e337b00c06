"""The learner's intake: a stored report (or a `train` demonstration) made into the samples a weight recipe trains
on. A report passes its recipe's schema again (one stored by an earlier version may not), its inferences become
one sample each, or an agent's episode one sample of all its turns (reef_lab/learning/episodes.py); a sample
carries the report's words (a self-teacher's context) and the numbers its metadata holds. What the learner does
with the samples (pool, batches, ledger) is reef_lab.learning.learner's."""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable

from reef_lab.learning import episodes
from reef_lab.publishing.releases import BASE
from reef_lab.trainers.samples import Sample


class Intake:
    """Records to samples for one scenario's weight recipe."""

    def __init__(self, recipe, engine, records, episode_config: episodes.EpisodeConfig):
        self.recipe, self.engine, self.records, self.episode_config = recipe, engine, records, episode_config
        self.episode_counts: Counter = Counter()  # [episodes hook] how reports on episodes became samples

    def samples(self, kind: str, rec: dict, consumed: Callable[[str], bool]) -> list[Sample]:
        """The samples of a report (`kind` "report") or a demonstration ("demo"); `consumed(id)`: a record that
        training has used already (its turns are left out). Raises when the record cannot become any."""
        if kind == "demo":
            return self._demonstration(rec)
        # The recipe's report schema, again: a report stored by an earlier version, or by a path that skipped it,
        # is failed with the schema's message rather than trained on (a context past max_context_chars, say).
        self.recipe.validate_report(rec)
        refs = [r for r in rec.get("references") or [] if not consumed(r)]
        # [episodes hook] calls of one episode make one sample (reef_lab/learning/episodes.py)
        out = episodes.samples_for_report(rec, self.records.get_many(refs), self.episode_config,
                                          self.episode_counts)
        measured, words = report_measures(rec), report_context(rec)
        for s in out:
            s.extra["report_measures"] = measured
            s.context = words  # the report's words: a self-distillation teacher's context
            # 0.1's side channel, read by plug-ins written against it: kept until 0.3.0 (CHANGELOG)
            s.extra["feedback"], s.extra["context"] = rec.get("feedback"), rec.get("context")
        return out

    def _demonstration(self, rec: dict) -> list[Sample]:
        if rec.get("prompt_token_ids") and rec.get("token_ids"):  # templated by the client, e.g. a tool episode's
            return [Sample(record_id=rec["id"], prompt_ids=list(rec["prompt_token_ids"]),  # turn: as given
                           completion_ids=list(rec["token_ids"]), logprobs=None, score=rec.get("score"),
                           release_id=BASE, created_at=rec.get("created_at") or 0.0,
                           extra={"demonstration": True})]
        request, response = rec.get("request") or {}, rec.get("response")
        if isinstance(request, dict) and request.get("tools"):
            raise ValueError("a demonstration with tools needs its prompt_token_ids and token_ids (the engine "
                             "templates tools; see reef_lab/tasks/demos.py)")
        text = response.get("content") if isinstance(response, dict) else response
        if not isinstance(request, dict) or not isinstance(request.get("messages"), list) or not isinstance(
                text, str):
            return []
        return [Sample(record_id=rec["id"], prompt_ids=self.engine.prompt_ids(request["messages"]),
                       completion_ids=self.engine.completion_ids(text), logprobs=None, score=rec.get("score"),
                       release_id=BASE, created_at=rec.get("created_at") or 0.0,
                       extra={"demonstration": True})]


def report_context(report: dict) -> str | None:
    """The teacher context of a report (what intake puts in `Sample.context`; distillation's
    recipes check it at the report's door: distill.check_report_context): its `context` field; without one,
    its feedback's words (the string, or an object's `context`)."""
    text = report.get("context")
    if not isinstance(text, str) or not text.strip():
        feedback = report.get("feedback")
        text = feedback.get("context") if isinstance(feedback, dict) else feedback
    return text.strip() or None if isinstance(text, str) else None


def report_measures(report: dict) -> dict[str, float]:
    """The numbers a report's `metadata` carries (booleans as 0/1), e.g. a tool task's `correct` and
    `valid_call_fraction`: what a step's metrics average over its batch, so a run shows them per step."""
    meta = report.get("metadata") if isinstance(report.get("metadata"), dict) else {}
    return {k: float(v) for k, v in meta.items()
            if isinstance(k, str) and isinstance(v, (bool, int, float)) and math.isfinite(v) and k != "exp_index"}


def batch_report_means(batch: list[Sample]) -> dict[str, float]:
    """`report_<key>`: the mean of each report number over the batch's samples that carry it."""
    sums: dict[str, list[float]] = {}
    for s in batch:
        for k, v in (s.extra.get("report_measures") or {}).items():
            sums.setdefault(k, []).append(v)
    return {f"report_{k}": sum(vs) / len(vs) for k, vs in sorted(sums.items())}
