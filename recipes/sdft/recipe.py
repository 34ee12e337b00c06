"""`sdft`: self-distillation from the words of a report (the teacher context).

The teacher is the student itself, as it is at the start of the step, shown the request **plus** a context the
student did not see: the report's feedback (a correction, the right answer, a worked example, a demonstration). It
scores the student's own sampled tokens (no new tokens, never re-tokenised text) and the step lowers the divergence
between the student without the context and the student with it: what the words would have changed in the answer
moves into the weights, and the release answers that way without them.

The context is the report's `feedback`: a string, or an object's `context` string (`{"context": "...", ...}`); a
report that references an answer without one is refused (400), as is one longer than `max_context_chars`. It is put
into the teacher's prompt as a system message (appended to the request's own system message, if any) through
`context_template`; the engine's chat template makes the tokens. Requests with tools are templated without their
tool definitions for the teacher (a known limit, docs/learning.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.errors import BadRequest
from reef_lab.learning import rl
from reef_lab.learning.distill import DistillConfig, distill_step
from reef_lab.learning.learner import Learner, WeightRecipe
from reef_lab.trainers.samples import Sample
from reef_lab.wire import OPENAI_CHAT


def report_context(feedback) -> str | None:
    """The teacher context a report's feedback carries: the string, or an object's `context` string."""
    text = feedback.get("context") if isinstance(feedback, dict) else feedback
    return text.strip() or None if isinstance(text, str) else None


@dataclass
class SDFTConfig(DistillConfig):
    context_template: str = field(default=(
        "Feedback on an earlier answer to this request, to take into account: {context}"), metadata={
        "help": "how the report's context enters the teacher's system prompt ({context} is replaced)"})
    max_context_chars: int = field(default=4000, metadata={"client_max": 32_000,
        "help": "the longest context a report may carry (longer: 400)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if "{context}" not in self.context_template:
            raise ValueError("context_template must contain {context}, where the report's words go")
        if self.max_context_chars < 1:
            raise ValueError("max_context_chars must be at least 1")


class SDFTRecipe(WeightRecipe):
    name = "sdft"

    def __init__(self, **config):
        self.config = SDFTConfig(**config)
        self._records = self._engine = None

    def learner(self, ctx) -> Learner:
        self._records, self._engine = ctx.records, ctx.engine
        return Learner(ctx, self)

    def validate_report(self, report: dict) -> None:
        if not report.get("references"):
            return
        context = report_context(report.get("feedback"))
        if context is None:
            raise BadRequest(f"the {self.name} recipe learns from the words of a report: give 'feedback' as a string "
                             "or as an object with a 'context' string (a correction, the right answer, a worked "
                             "example)")
        if len(context) > self.config.max_context_chars:
            raise BadRequest(f"the report's context has {len(context)} characters; this scenario takes at most "
                             f"{self.config.max_context_chars} (max_context_chars)")

    def accepts(self, sample: Sample) -> bool:
        return (sample.logprobs is not None and not sample.extra.get("demonstration")
                and report_context(sample.extra.get("feedback")) is not None)

    def _fresh(self, pool, step, release_steps):
        return rl.split_by_staleness(pool, step, release_steps, self.config.max_staleness)

    def ready(self, pool, trainer_step, release_steps) -> bool:
        return len(self._fresh(pool, trainer_step, release_steps)[0]) >= self.config.batch_size

    def build_batch(self, pool, trainer_step, release_steps):
        fresh, stale = self._fresh(pool, trainer_step, release_steps)
        return fresh[: self.config.batch_size], stale

    def teacher_prompts(self, batch: list[Sample]) -> list[list[int]]:
        """Each sample's request with the report's context in the system message, as the engine templates it."""
        records = {r["id"]: r for r in self._records.get_many([s.record_id for s in batch])}
        prompts = []
        for s in batch:
            record = records.get(s.record_id) or {}
            if record.get("dialect") not in (OPENAI_CHAT, ""):
                raise ValueError(f"sample {s.record_id}: a {record.get('dialect')} request; sdft adds the context to "
                                 "chat-completions messages only (for now)")
            request = record.get("request") or {}
            messages = request.get("messages") if isinstance(request, dict) else None
            if not isinstance(messages, list) or not messages:
                raise ValueError(f"sample {s.record_id}: its record holds no chat messages to add the context to "
                                 "(sdft reads the request's messages)")
            prompts.append(self._engine.prompt_ids(with_context(
                messages, self.config.context_template.format(context=report_context(s.extra.get("feedback"))))))
        return prompts

    def train(self, trainer, batch: list[Sample]) -> dict:
        return distill_step(trainer, batch, self.config, None, self.teacher_prompts(batch))


def with_context(messages: list[dict], context: str) -> list[dict]:
    """The messages with `context` in the system message: appended to the first message's text if it is a string
    system message, else a new system message in front."""
    first = messages[0] if isinstance(messages[0], dict) else {}
    if first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{context}"}, *messages[1:]]
    return [{"role": "system", "content": context}, *messages]
