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

from dataclasses import dataclass

from reef_lab.learning import rl
from reef_lab.learning.distill import ContextDistillConfig, ContextTeacher, check_report_context, distill_step
from reef_lab.learning.learner import WeightRecipe
from reef_lab.trainers.samples import Sample


@dataclass
class SDFTConfig(ContextDistillConfig):
    """sdft's config: the distillation knobs and the context's template and size limit (ContextDistillConfig)."""


class SDFTRecipe(ContextTeacher, rl.FreshBatches, WeightRecipe):
    name = "sdft"

    def __init__(self, **config):
        self.config = SDFTConfig(**config)

    def validate_report(self, report: dict) -> None:
        check_report_context(self.name, report, self.config, required=True)

    def accepts(self, sample: Sample) -> bool:
        return (sample.logprobs is not None and not sample.extra.get("demonstration")
                and sample.context is not None)

    def train(self, trainer, batch: list[Sample]) -> dict:
        return distill_step(trainer, batch, self.config, None, self.teacher_prompts(batch), self.config.teacher_ema)
