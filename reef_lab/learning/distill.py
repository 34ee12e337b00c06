"""What the distillation recipes share (recipes/opd, sdft, sdpo): the teacher they name, checked when the
scenario's learner starts; the teacher context a report's words make; and the one step they take (the teacher scores
the student's own tokens, then the trainer's `distill` loss, reef_lab/trainers/losses.py).

The teacher is an operator's choice (every TeacherConfig field is operator-only): it names weights on this machine
(a folder, a release of any scenario), which a tenant's client must not be able to read through a config.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from reef_lab.errors import BadRequest
from reef_lab.learning.intake import report_context
from reef_lab.learning.learner import Learner
from reef_lab.learning.recipe import LearnConfig
from reef_lab.schema import check_fields
from reef_lab.trainers.base import DistillTrainer, Loss
from reef_lab.trainers.divergences import TABLE, divergence
from reef_lab.trainers.samples import InvalidSamples, Sample
from reef_lab.wire.dialects import engine_request, with_system

DIVERGENCES = tuple(TABLE)  # 0.1's name for the built-in ones (the table: reef_lab/trainers/divergences.py)


@dataclass
class TeacherConfig:
    model_path: str | None = field(default=None, metadata={"operator": True, "help":
        "a local Hugging Face model folder, or a .gguf file (dequantised once into the model cache, as the engine "
        "does), with the student's tokenizer (refused otherwise); none: the deployment's own model"})
    release: str | None = field(default=None, metadata={"operator": True, "help":
        "a weights release of this deployment, '<scenario>:vN' (an earlier release, another scenario's): its weights "
        "on model_path's architecture"})
    server_url: str | None = field(default=None, metadata={"operator": True, "help":
        "a vLLM server (http://host:port) that serves the teacher: it scores the student's token ids there "
        "(/v1/completions with prompt_logprobs), so the teacher never loads beside the trainer (a bigger model on "
        "its own GPUs); not the deployment's own serving engine, which stands aside while the trainer steps"})
    server_model: str | None = field(default=None, metadata={"operator": True, "help":
        "server_url: the teacher's model name there (default: the first of its /v1/models)"})
    server_timeout_s: float = field(default=300.0, metadata={"operator": True, "help":
        "server_url: how long one scoring call may take"})

    def __post_init__(self) -> None:
        check_fields(self)
        gguf = self.model_path is not None and self.model_path.endswith(".gguf")
        if gguf and not Path(self.model_path).is_file():
            raise ValueError(f"teacher.model_path {self.model_path!r}: no such .gguf file")
        if self.model_path is not None and not gguf and not (Path(self.model_path) / "config.json").is_file():
            raise ValueError(f"teacher.model_path {self.model_path!r} is not a Hugging Face model folder (no "
                             "config.json there) or a .gguf file: name a local folder holding the teacher's weights "
                             "and tokenizer")
        if self.release is not None and (":" not in self.release or not self.release.split(":", 1)[1]):
            raise ValueError(f"teacher.release {self.release!r} must name a release as '<scenario>:vN', e.g. "
                             "'calculator:v3'")
        if self.server_url is not None and (self.model_path is not None or self.release is not None):
            raise ValueError("teacher.server_url names a teacher served elsewhere: leave model_path and release unset")
        if self.server_url is not None and not self.server_url.startswith("http://"):
            raise ValueError(f"teacher.server_url must be http://host:port, got {self.server_url!r}")
        if self.server_timeout_s <= 0:
            raise ValueError("teacher.server_timeout_s must be > 0")

    @property
    def named(self) -> bool:
        return self.model_path is not None or self.release is not None or self.server_url is not None


@dataclass
class DistillConfig(LearnConfig):
    """A distillation recipe's knobs: the divergence, its top-K, the importance-sampling cap, the batch."""

    divergence: str = field(default="reverse_kl", metadata={"help": "; ".join(
        f"{d.name}: {d.help}" for d in TABLE.values()) + " (reef_lab/trainers/divergences.py)"})
    top_k: int = field(default=16, metadata={"client_max": 256, "help":
        "forward_kl / jsd: how many of the teacher's most likely tokens per position the divergence covers"})
    is_cap: float = field(default=2.0, metadata={"help":
        "reverse_kl: the cap on pi_student / pi_rollout for tokens an older release sampled"})
    jsd_beta: float = field(default=0.5, metadata={"help": "jsd: the weight on the teacher (0.5: symmetric)"})
    batch_size: int = field(default=8, metadata={"client_max": 1024, "help": "samples per optimizer step"})
    max_staleness: int = field(default=8, metadata={"help": "most policy steps a rollout may lag the trainer"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if divergence(self.divergence).top_k and self.top_k < 1:
            raise ValueError(f"divergence {self.divergence!r} compares the teacher's top-K tokens: top_k must be at "
                             f"least 1, got {self.top_k}")
        if self.is_cap < 1:
            raise ValueError(f"is_cap must be at least 1 (1: no token counts more than once), got {self.is_cap}")
        if not 0 < self.jsd_beta < 1:
            raise ValueError(f"jsd_beta must be in (0, 1), got {self.jsd_beta}")
        if self.batch_size < 1 or self.max_staleness < 0:
            raise ValueError("batch_size must be at least 1 and max_staleness at least 0")

    @property
    def loss(self) -> Loss:
        return Loss("distill", divergence=self.divergence, is_cap=self.is_cap, jsd_beta=self.jsd_beta)

    @property
    def scored_top_k(self) -> int:
        return self.top_k if divergence(self.divergence).top_k else 0


@dataclass
class SelfTeacherConfig(DistillConfig):
    """The self-teacher's weights (sdft, sdpo, ctxd: the policy, shown a context the student did not see)."""

    teacher_ema: float = field(default=0.0, metadata={"help":
        "0: the teacher is the policy as it is at each step's start; in (0, 1): an exponential moving average of "
        "the policy's weights with this decay, moved once per step (a slower, steadier teacher); it starts again "
        "from the policy when the trainer does (a restart, a rollback)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.teacher_ema < 1:
            raise ValueError(f"teacher_ema must be 0 (the policy itself) or a decay in (0, 1), got {self.teacher_ema}")


@dataclass
class ContextDistillConfig(SelfTeacherConfig):
    """Self-distillation with a teacher context: where the report's words go in the teacher's prompt, and how long
    they may be."""

    context_template: str = field(default=(
        "Feedback on an earlier answer to this request, to take into account: {context}"), metadata={
        "help": "how the report's context enters the teacher's system prompt (each {context} is replaced by it; "
                "nothing else in the text is read)"})
    max_context_chars: int = field(default=4000, metadata={"client_max": 32_000,
        "help": "the longest context a report may carry (longer: 400)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if "{context}" not in self.context_template:
            raise ValueError("context_template must contain {context}, where the report's words go")
        if self.max_context_chars < 1:
            raise ValueError("max_context_chars must be at least 1")


def check_report_context(recipe: str, report: dict, config: ContextDistillConfig, required: bool) -> None:
    """BadRequest for a report (on answers) whose words a recipe needs and it lacks, or that are too long."""
    if not report.get("references"):
        return
    context = report_context(report)
    if context is None and required:
        raise BadRequest(f"the {recipe} recipe learns from the words of a report: give 'context' (a correction, the "
                         "right answer, a worked example; or 'feedback' as a string)")
    if context is not None and len(context) > config.max_context_chars:
        raise BadRequest(f"the report's context has {len(context)} characters; this scenario takes at most "
                         f"{config.max_context_chars} (max_context_chars)")


def with_context(messages: list[dict], context: str) -> list[dict]:
    """The messages with `context` in the system message: appended to the first message's text if it is a string
    system message, else a new system message in front."""
    first = messages[0] if isinstance(messages[0], dict) else {}
    if first.get("role") == "system" and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{context}"}, *messages[1:]]
    return [{"role": "system", "content": context}, *messages]


def remake_prompt(engine, record: dict, system: str | None = None, context: str | None = None) -> list[int]:
    """A served call's prompt made again from its record, as serving templated it (the engine's chat template, the
    request's tools and tool choice, any dialect read by reef_lab.wire): as the client sent it, with a harness's
    `system` text in front (as serving applied it), or with words (`context`) in its system message. The one place
    sdft, sdpo and ctxd make a teacher's or a student's prompt. ValueError when the record holds no request."""
    request, dialect = record.get("request"), record.get("dialect")
    if not isinstance(request, dict) or not dialect:
        raise ValueError("its record holds no request to make the prompt from")
    chat = engine_request(dialect, with_system(dialect, request, system) if system is not None else request)
    if context is not None:
        chat = replace(chat, messages=with_context(chat.messages, context))
    return engine.request_ids(chat)


def context_prompts(batch: list[Sample], records, engine, template: str) -> list[list[int]]:
    """Each sample's request with its report's context in the system message, templated by the engine as serving
    templated it (the chat template that made the student's prompt, the request's tools and tool choice included),
    from a request of any dialect (read by reef_lab.wire)."""
    by_id = {r["id"]: r for r in records.get_many([s.record_id for s in batch])}
    prompts, errors = [], {}
    for s in batch:
        record = by_id.get(s.record_id) or {}
        if not isinstance(record.get("request"), dict) or not record.get("dialect"):
            errors[s.record_id] = "its record holds no request to add the context to"
            continue
        try:
            prompts.append(remake_prompt(engine, record, context=template.replace("{context}", s.context or "")))
        except Exception as e:  # noqa: BLE001 - a stored request that cannot be templated again: this sample's own
            errors[s.record_id] = f"its request cannot be templated with the context: {e}"
    if errors:  # only these fail; the batch's other samples train next round (reef_lab.learning.learner)
        raise InvalidSamples.of(errors)
    return prompts


class ContextTeacher:
    """A self-distillation recipe's teacher prompts (sdft, sdpo): its learner keeps the scenario's records and the
    engine whose chat template makes them. Mixed in before WeightRecipe; reads config.context_template."""

    _records = _engine = None

    def learner(self, ctx) -> Learner:
        self._records, self._engine = ctx.records, ctx.engine
        return Learner(ctx, self)

    def teacher_prompts(self, batch: list[Sample]) -> list[list[int]]:
        return context_prompts(batch, self._records, self._engine, self.config.context_template)


@dataclass(frozen=True)
class ResolvedTeacher:
    """Where the teacher's weights are: the model folder and, for a release, its weights folder; or the server
    that scores it (then the folders are unused)."""

    model_dir: Path
    release_folder: Path | None
    name: str  # the release id, the folder, "base", or the server's model
    server: ServerTeacher | None = None


TOKENIZER_PROBE = ("The teacher's tokenizer must be the student's: 12 + 30 = 42; naïve café, 東京, emoji 🙂, "
                   "<tool_call>{\"name\": \"add\"}</tool_call>\n\tdone.")


class ServerTeacher:
    """A teacher scored by a vLLM server (reef_lab.engines.vllm.PromptScorer: prompt_logprobs on the token ids, the
    teacher's prompt then the student's own completion tokens; raw logits, temperature 1, as the trainer's loss
    expects), checked to tokenize as the student does."""

    def __init__(self, url: str, model: str | None, timeout: float):
        from reef_lab.engines.vllm import PromptScorer  # the learner's start only

        self.scorer = PromptScorer(url, model, timeout)
        self.model = self.scorer.model

    def check_tokenizer(self, student_dir: Path) -> None:
        """Refuse a server whose tokenizer gives other ids than the student's for a probe text (the whole
        vocabulary cannot be read from the server; a tokenizer of another family fails the probe)."""
        from transformers import AutoTokenizer

        mine = AutoTokenizer.from_pretrained(student_dir, local_files_only=True).encode(
            TOKENIZER_PROBE, add_special_tokens=False)
        theirs = self.scorer.tokenize(TOKENIZER_PROBE)
        if theirs != mine:
            raise ValueError(f"the teacher {self.model!r} at {self.scorer.url} tokenizes differently from the student "
                             f"at {student_dir} (a probe text: {len(theirs)} vs {len(mine)} tokens): distillation "
                             "scores the student's own token ids; serve a teacher of the same tokenizer")

    def score(self, samples: list[Sample], prompts: list[list[int]], top_k: int = 0) -> None:
        """Fill each sample's teacher_logprobs (and with top_k teacher_top_ids / teacher_top_logprobs)."""
        from concurrent.futures import ThreadPoolExecutor

        def one(pair: tuple[Sample, list[int]]) -> None:
            s, prompt = pair
            lps, top_ids, top_lps = self.scorer.score(list(prompt), list(s.completion_ids), top_k)
            s.teacher_logprobs = lps
            if top_k:
                s.teacher_top_ids, s.teacher_top_logprobs = top_ids, top_lps

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, zip(samples, prompts, strict=True)))


def resolve_teacher(teacher: TeacherConfig, student_dir: Path, releaser) -> ResolvedTeacher:
    """The teacher's folders, checked now (the learner's start): a release that exists and holds weights, a model
    folder whose tokenizer is the student's. ValueError naming the field and the fix otherwise."""
    if teacher.server_url is not None:
        server = ServerTeacher(teacher.server_url, teacher.server_model, teacher.server_timeout_s)
        server.check_tokenizer(Path(student_dir))
        return ResolvedTeacher(Path(student_dir), None, f"{server.model} at {teacher.server_url}", server)
    model_dir = Path(teacher.model_path) if teacher.model_path else Path(student_dir)
    if model_dir.suffix == ".gguf":
        from reef_lab.engines.embedded.loading import gguf_folder  # dequantised once, as the engine would serve it

        model_dir = gguf_folder(model_dir)
    if model_dir != Path(student_dir):
        from reef_lab.trainers.logprobs import check_same_tokenizer  # imports transformers: the learner's start only

        check_same_tokenizer(student_dir, model_dir)
    folder = None
    if teacher.release:
        scenario = teacher.release.split(":", 1)[0]
        if scenario not in releaser.scenarios():
            raise ValueError(f"teacher.release {teacher.release!r}: this deployment has no scenario {scenario!r} "
                             "with releases")
        rel = releaser.release(scenario, teacher.release)  # NotFound names the release
        if rel is None or rel.get("kind", "weights") != "weights":
            raise ValueError(f"teacher.release {teacher.release!r} is not a weights release (a harness release "
                             "changes no weights to distil from)")
        folder = Path(rel["folder"])
    name = teacher.release or (str(model_dir) if teacher.model_path else "base")
    return ResolvedTeacher(model_dir, folder, name)


def teacher_gap(batch: list[Sample]) -> dict:
    """The teacher-student log-prob gap on the generated tokens the step trains: mean of log pi_teacher(y) minus
    log pi_rollout(y) (the engine's logprob at sampling); it shrinks as the student takes the teacher's choices."""
    gaps = [t - s for smp in batch if smp.teacher_logprobs is not None and smp.logprobs is not None
            for t, s, m in zip(smp.teacher_logprobs, smp.logprobs, smp.mask, strict=True) if m]
    return {"teacher_gap": sum(gaps) / len(gaps)} if gaps else {}


def distill_step(trainer, batch: list[Sample], config: DistillConfig, teacher: ResolvedTeacher | None,
                 prompts: list[list[int]] | None = None, ema: float = 0.0) -> dict:
    """Score the batch under the teacher (None: the policy itself, as it is before this step) with `prompts` in
    front of each completion when given (a teacher context), then one `distill` step; the metrics carry the
    divergence and the teacher gap."""
    if not isinstance(trainer, DistillTrainer):
        raise ValueError(f"trainer backend {type(trainer).__name__} cannot score a teacher: distillation recipes "
                         "need trainer.backend torch")
    if teacher is None:
        if prompts is None:
            raise ValueError("self-distillation needs the teacher's prompts (the student's, with a context added)")
        trainer.score_self(batch, prompts, config.scored_top_k, ema)
    elif teacher.server is not None:
        teacher.server.score(batch, prompts or [s.prompt_ids for s in batch], config.scored_top_k)
    else:
        trainer.score_teacher(batch, teacher.model_dir, teacher.release_folder, config.scored_top_k, prompts)
    m = trainer.step(batch, config.loss)
    tokens = m.get("tokens") or 0
    out = {**m, **teacher_gap(batch), "policy_step": True}
    if f"{config.divergence}_sum" in m and tokens:  # the divergence per trained token (reverse_kl: its estimate)
        out[config.divergence] = m[f"{config.divergence}_sum"] / tokens
    scores = [s.score for s in batch if s.score is not None]
    if scores:
        out["reward_mean"] = sum(scores) / len(scores)
    return out
