"""`opd`: on-policy distillation from a stronger teacher.

The student (the scenario's serving weights) answers the traffic; each reported answer is scored, token by token, by
a frozen teacher on the very token ids the student sampled (no new tokens, never re-tokenised text), and the step
lowers the divergence between the two there: by default the reverse KL on the sampled token (the dense, mode-seeking
signal of on-policy distillation), or forward KL / JSD over the teacher's top-K. The report needs no score: a score,
if given, is only metadata (`reward_mean`). Rollouts older than `max_staleness` policy steps are dropped; fresher ones
sampled by an earlier release are reweighted by the importance ratio, capped at `is_cap`.

The teacher (`teacher: {model_path, release}`, operator-only) is checked when the learner starts: a release must
exist and hold weights, a model folder must share the student's tokenizer (refused with a message naming both,
never re-tokenised). The student should sample at temperature 1: the ratio compares the student at temperature 1
with the engine's recorded logprob, which is at the sampling temperature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.learning import rl
from reef_lab.learning.distill import DistillConfig, ResolvedTeacher, TeacherConfig, distill_step, resolve_teacher
from reef_lab.learning.learner import Learner, WeightRecipe
from reef_lab.trainers.samples import Sample


@dataclass
class OPDConfig(DistillConfig):
    teacher: TeacherConfig = field(default_factory=TeacherConfig, metadata={
        "help": "reef_lab.learning.distill.TeacherConfig: the frozen teacher (model_path and/or release)"})


class OPDRecipe(rl.FreshBatches, WeightRecipe):
    name = "opd"

    def __init__(self, **config):
        self.config = OPDConfig(**config)
        self.teacher: ResolvedTeacher | None = None

    def learner(self, ctx) -> Learner:
        if not self.config.teacher.named:  # checked here, not in the config: the defaults must build (schema walks)
            raise ValueError("opd distils from a teacher other than the student, and this scenario names none: set "
                             "teacher.release ('<scenario>:vN') or teacher.model_path (a local model folder with the "
                             "same tokenizer) in the operator's --recipe-config")
        self.teacher = resolve_teacher(self.config.teacher, ctx.engine.model_dir, ctx.releaser)
        return Learner(ctx, self)

    def accepts(self, sample: Sample) -> bool:
        # the importance ratio needs the engine's logprobs; a demonstration is not the student's own sample
        return sample.logprobs is not None and not sample.extra.get("demonstration")

    def train(self, trainer, batch: list[Sample]) -> dict:
        return distill_step(trainer, batch, self.config, self.teacher)
