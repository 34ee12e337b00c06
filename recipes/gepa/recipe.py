"""`gepa`: evolve the scenario's harness (system prompt, rules, skills) from reported traffic with GEPA.

No weights change: any model endpoint serves (the embedded model or an upstream provider). Reports feed the search
(recipes/gepa/learner.py): `feedback` text is what the reflection model reads, `metadata.answer` (the reference
answer, key set by `answer_key`) lets the task's verifier score a candidate harness on the same request. Candidates
are scored on a validation set drawn from `val_task`; a kept candidate that passes the selection policy becomes a
harness release. Experiments use the same search on a task set: scripts/run_experiment.py
recipes/gepa/examples/arithmetic.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reef_lab.errors import BadRequest
from reef_lab.harness.tree import load as load_harness
from reef_lab.harness.change_requests import RequestConfig
from reef_lab.engines.lm import LMSpec
from reef_lab.learning.recipe import MODES, LearnContext
from reef_lab.schema import check_fields
from reef_lab.tasks.base import TaskConfig

from .experiment import DEFAULT_SEED_HARNESS
from .search import GEPAConfig


@dataclass
class GEPARecipeConfig:
    mode: str = field(default="auto", metadata={
        "help": "auto: an iteration every minibatch_size new examples; manual: on POST /reef/train; hybrid: both"})
    selection: str = field(default="strict_gain", metadata={
        "help": "release a kept candidate: always, no_regression (validation mean >= serving's) or strict_gain (>)"})
    seed_harness: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SEED_HARNESS), metadata={
        "client_max_chars": 200_000, "help": "the harness served first when the scenario has none {path: text}"})
    val_task: TaskConfig = field(default_factory=lambda: {"name": "arithmetic", "system_prompt": ""}, metadata={
        "help": "validation task (reef_lab.tasks.base.TaskConfig fields) candidates are scored on"})
    val_size: int = field(default=16, metadata={"client_max": 1024, "help": "validation examples"})
    val_seed: int = field(default=999_983, metadata={"help": "seed of the validation items"})
    answer_key: str = field(default="answer", metadata={
        "help": "report metadata key holding the reference answer of the referenced inference"})
    task_max_tokens: int = field(default=48, metadata={"client_max": 4096,
        "help": "max_tokens of a candidate's answers (greedy)"})
    search: dict = field(default_factory=dict, metadata={
        "help": "recipes.gepa.search.GEPAConfig fields; max_metric_calls is the scenario's whole live budget",
        "schema": GEPAConfig})
    task_lm: dict | None = field(default=None, metadata={
        "help": "the task model (reef_lab.engines.lm.make_lm spec); default: the deployment's own model", "schema": LMSpec,
        "operator": True})
    reflection_lm: dict | None = field(default=None, metadata={
        "help": "the reflection model (reef_lab.engines.lm.make_lm spec); default: the task model", "schema": LMSpec,
        "operator": True})
    requests: dict = field(default_factory=dict, metadata={
        "help": "change requests in plain words (POST /reef/train {text}): "
                "reef_lab.harness.change_requests.RequestConfig "
                "fields (selection review|evaluate|promote|always, proposer_lm, ...); executable content needs the "
                "server's --harness-allow-executable 1",
        "schema": RequestConfig})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.selection not in ("always", "no_regression", "strict_gain"):
            raise ValueError(f"selection must be always, no_regression or strict_gain, got {self.selection!r}")
        try:
            load_harness(self.seed_harness)  # paths, sizes, front matter within YAML's limits
        except BadRequest as e:
            raise ValueError(f"seed_harness: {e.message}") from None
        self.search_config()
        self.request_config()
        if self.val_size < 1:
            raise ValueError("val_size must be at least 1")

    def request_config(self) -> RequestConfig:
        return RequestConfig(**self.requests)

    def search_config(self) -> GEPAConfig:
        return GEPAConfig(**{"max_metric_calls": 1_000_000, **self.search})


class GEPARecipe:
    name = "gepa"
    evolves = "harness"  # no weights: serving with an upstream provider is fine

    def __init__(self, **config):
        self.config = GEPARecipeConfig(**config)

    def validate_report(self, report: dict) -> None:
        answer = (report.get("metadata") or {}).get(self.config.answer_key)
        if answer is not None and (not isinstance(answer, (str, int, float)) or isinstance(answer, bool)):
            raise BadRequest(f"metadata.{self.config.answer_key} must be the reference answer (a string or number)")

    def learner(self, ctx: LearnContext):
        from .learner import HarnessLearner

        return HarnessLearner(ctx, self)

    @staticmethod
    def run_experiment(data: dict, progress: bool = True) -> dict:
        """An experiment of this recipe (scripts/run_experiment.py): train/validation/test splits, a budget of
        metric calls (recipes/gepa/experiment.py)."""
        from .experiment import GEPAExperimentConfig, run_gepa_experiment

        return run_gepa_experiment(GEPAExperimentConfig.parse(data), progress=progress)
