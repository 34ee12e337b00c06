"""`ctxd`: context distillation. The teacher is the model served **with** a harness (its system text: GEPA's best
release, a composite's harness, a hand-written worked-examples prompt); the student is the same weights **without**
it. The step lowers the divergence between the two on the answers' own token ids, so the release behaves as the
harness made the model behave, with a shorter prompt.

The usual flow: a scenario serves a harness release (the traffic is the teacher's own samples), reports come in
(no score needed), and ctxd trains the weights; the weights release then serves **without** the harness (a weights
release takes the scenario's serving over from the harness release; rolling back brings the harness back). Both
prompts are made from the client's recorded request through the engine's chat template: the teacher's with the
harness's system text in front, exactly as serving applied it, the student's without; a sample whose re-made prompt
does not reproduce the served one token for token (a client that rewrote the served request) is left out
of the step and counted (`ctxd_skipped`). The default divergence is forward KL over the teacher's top-K: on the
teacher's own samples that is the loss of Snell et al.'s context distillation; reverse KL on the sampled token suits
answers the student sampled (a configured `harness` while serving the weights alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.learning import rl
from reef_lab.learning.distill import SelfTeacherConfig, distill_step, remake_prompt
from reef_lab.learning.learner import Learner, WeightRecipe
from reef_lab.trainers.samples import Sample


@dataclass
class CTXDConfig(SelfTeacherConfig):
    divergence: str = field(default="forward_kl", metadata={"help":
        "forward_kl (default: the teacher sampled the answers, served with its harness) or jsd over the teacher's "
        "top_k tokens; reverse_kl on the sampled token when the student sampled them"})
    harness: str | None = field(default=None, metadata={"operator": True, "help":
        "the harness release whose system text is the teacher's context, '<scenario>:vN'; none: the harness "
        "release that served each answer (answers served without one are left out)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.harness is not None and (":" not in self.harness or not self.harness.split(":", 1)[1]):
            raise ValueError(f"harness {self.harness!r} must name a harness release as '<scenario>:vN'")


class CTXDRecipe(rl.FreshBatches, WeightRecipe):
    name = "ctxd"
    absorbs = ("harness",)  # in a composite (GEPA -> ctxd) its weights release serves without the harness

    def __init__(self, **config):
        self.config = CTXDConfig(**config)
        self._ctx = None
        self._systems: dict[str, str | None] = {}  # harness release id -> its system text (None: not a harness)

    def learner(self, ctx) -> Learner:
        self._ctx = ctx
        if self.config.harness is not None and self._system(self.config.harness) is None:
            raise ValueError(f"harness {self.config.harness!r} is not a harness release of this deployment: name "
                             "one that `GET /reef/scenarios/<s>/harness?release_id=...` shows")
        return Learner(ctx, self)

    def _system(self, release_id: str) -> str | None:
        if release_id not in self._systems:
            scenario = release_id.split(":", 1)[0]
            found = (self._ctx.releaser.harness(scenario, release_id)
                     if scenario in self._ctx.releaser.scenarios() else None)
            self._systems[release_id] = found.system if found is not None and found.system else None
        return self._systems[release_id]

    def _served_system(self, release_id: str) -> str | None:
        """The system text of the harness release that served a sample, looked up in this scenario only: an
        imported record's release_id is whatever its importer wrote, and one naming another scenario's release
        must neither teach nor reveal whether that release exists."""
        if release_id.split(":", 1)[0] != self._ctx.scenario:
            return None
        return self._system(release_id)

    def accepts(self, sample: Sample) -> bool:
        if sample.logprobs is None or sample.extra.get("demonstration"):
            return False
        return self.config.harness is not None or self._served_system(sample.release_id) is not None

    def prompts(self, batch: list[Sample]) -> tuple[list[Sample], list[list[int]]]:
        """The samples whose prompts re-make faithfully, each with the student's prompt (no harness) in place of
        the served one, and the teacher's prompts (the harness in front)."""
        engine, by_id = self._ctx.engine, {r["id"]: r for r in self._ctx.records.get_many([s.record_id for s in batch])}
        kept, teacher = [], []
        for s in batch:
            rec = by_id.get(s.record_id) or {}
            request, dialect = rec.get("request"), rec.get("dialect")
            system = (self._system(self.config.harness) if self.config.harness is not None
                      else self._served_system(s.release_id))
            if not isinstance(request, dict) or not dialect or system is None:
                continue
            student, taught = remake_prompt(engine, rec), remake_prompt(engine, rec, system=system)
            served_with_it = self.config.harness is None or self.config.harness == s.release_id
            if s.prompt_ids != (taught if served_with_it else student):
                continue  # the served prompt is not what re-templating makes (an episode's sample, drift)
            s.prompt_ids = student
            kept.append(s)
            teacher.append(taught)
        return kept, teacher

    def train(self, trainer, batch: list[Sample]) -> dict:
        kept, teacher = self.prompts(batch)
        if not kept:
            raise ValueError(f"none of the {len(batch)} samples could be re-made without the harness: their recorded "
                             "requests do not reproduce the prompts they were served with")
        m = distill_step(trainer, kept, self.config, None, teacher, self.config.teacher_ema)
        m["ctxd_skipped"] = len(batch) - len(kept)
        m["prompt_tokens_saved"] = sum(len(t) - len(s.prompt_ids) for s, t in zip(kept, teacher)) / len(kept)
        return m
