"""The Recipe protocol: how a scenario turns reported traffic into an improvement.

A recipe declares what it `evolves`: "weights" (a trained release the engine serves), "harness" (the prompts,
rules and skills applied to each request) or "nothing" (it records and validates only). Every recipe checks the
reports it is given against its own schema (`validate_report`) and, when it learns, builds the scenario's learner
from a `LearnContext` (the narrow ways a learner touches the deployment, never the gateway): the learner is the recipe's
own. Weight recipes derive from reef_lab.learning.learner.WeightRecipe, which drives their hooks (`accepts`, `ready`,
`build_batch`, `make_trainer`, `train`) with the shared weight learner; a harness recipe (recipes/gepa) brings its
own learner.

A deployment names its recipe by a `module:Class` path, or by a bare name `x` meaning `recipes.x:Recipe`.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from reef_lab.errors import BadRequest, ReefError
from reef_lab.files import JsonDoc
from reef_lab.harness.change_requests import RequestStore
from reef_lab.plugins import import_path
from reef_lab.learning.episodes import EpisodeConfig
from reef_lab.tasks.base import TaskConfig
from reef_lab.engines.base import Engine
from reef_lab.engines.lm import LM
from reef_lab.publishing.releaser import SELECTIONS, Releaser
from reef_lab.publishing.tracking import Tracker
from reef_lab.records.reader import RecordsReader
from reef_lab.schema import check_fields
from reef_lab.trainers.base import TrainerConfig

MODES = ("auto", "manual", "hybrid")
EVOLVES = ("weights", "harness", "nothing", "composite")  # composite: named components, each a recipe of its own


@dataclass
class LearnContext:
    """What a scenario's learner is given by the deployment that runs it: the narrow ways it touches the deployment,
    never the gateway itself (tests/test_layout.py: no learner or recipe imports it)."""

    scenario: str
    data_dir: Path  # the deployment's data dir
    state_dir: Path  # the learner keeps its state here (data_dir/learn/<scenario>/; a component's below it)
    infer: Callable[..., dict]  # infer(body, tags=None) -> the stored inference record of a rollout of its own
    report: Callable[..., tuple[bool, str]]  # report(body, tags=None) -> (created, id); not handed back to it
    releaser: Releaser  # the one path from a candidate to the serving release
    records: RecordsReader  # the scenario's records, read only
    engine: Engine  # its capabilities, model and tokenizer (loading releases is the releaser's)
    make_lm: Callable[[dict | None], LM]  # a reef_lab.engines.lm spec -> LM; None: the deployment's own model
    tracker: Tracker | None = None  # a W&B run mirroring the learner's metrics (None: tracking off)
    ledger: JsonDoc | None = None  # where its ledger lives (None: state_dir/state.json; shared: the database)
    requests: RequestStore | None = None  # change requests (None: data_dir/requests/; shared: the database)


class ScenarioLearner(Protocol):
    """A scenario's learner, running on its own thread. Request threads only hand it records."""

    def on_record(self, record: dict) -> None:
        """A stored report (or `train` demonstration) that references this scenario's inferences."""

    def request_training(self) -> dict:
        """POST /reef/train: queue a round (Conflict when there is nothing to learn from, or mode is auto)."""

    def request_change(self, body: dict) -> dict:
        """POST /reef/train {text, session?, release_id?}: a change request in plain words (harness learners,
        reef_lab/harness/change_requests.py); Conflict where the recipe evolves no harness."""

    def promote(self, candidate: str) -> dict:
        """POST /reef/scenarios/{s}/promote: publish a candidate waiting for review (Conflict if not offered)."""

    def on_rollback(self) -> None:
        """The serving release was set back: the next round starts from it."""

    def status(self) -> dict: ...

    def close(self) -> None: ...


class RecordHolder(ABC):
    """A learner that says which records it still needs: retention (reef_lab/records/retention.py) never evicts
    them. Those are the reports (and `train` records) it was handed but has not learned from yet and the records
    they reference, and what it has learned from but not yet named in a candidate's lineage. A learner that does
    not derive from this class is assumed to need every report of its scenario and all they reference."""

    @abstractmethod
    def held_records(self) -> set[str]:
        """Ids of the records this learner still needs (called from retention's thread)."""


@runtime_checkable
class Recipe(Protocol):
    name: str
    evolves: str  # one of EVOLVES; a composite recipe also has `components: dict[str, Recipe]`
    config: Any  # its config dataclass (help text per field; `operator` fields are never a client's to set)

    def validate_report(self, report: dict) -> None:
        """Raise BadRequest naming the problem when a report does not fit this recipe's schema."""

    def learner(self, ctx: LearnContext) -> ScenarioLearner | None:
        """The scenario's learner (None for a recipe that evolves nothing)."""

    # Experiments (reef_lab.experiments.run): a weight recipe (WeightRecipe) shares reef_lab.experiments.weights;
    # any other recipe that runs experiments has a static `run_experiment(data, progress=True) -> summary` that runs
    # (or resumes) one from its YAML mapping. Not a member here: a recipe without experiments still serves.


def recipe_class(spec: str) -> type:
    """The class a recipe name or module:Class path names (no config is checked)."""
    path = recipe_path(spec)
    try:  # a bare name is a folder of the shipped `recipes` package, never code from elsewhere
        return import_path(path, "recipe", builtin=":" not in spec)
    except ValueError as e:
        raise BadRequest(f"recipe {spec!r} cannot be loaded from {path!r} ({e}); name one of the folders in "
                         "recipes/ or give a module:Class path") from e


@dataclass
class LearnConfig:
    """What every training recipe shares: when it trains, how candidates are made and judged."""

    mode: str = field(default="auto", metadata={
        "help": "auto: train whenever a batch is ready; manual: only on POST /reef/train; hybrid: both"})
    selection: str = field(default="always", metadata={
        "help": "accept a candidate: always, no_regression (held-out accuracy >= serving), strict_gain (>), "
                "or review (wait for POST /reef/scenarios/{s}/promote)"})
    steps_per_candidate: int = field(default=1, metadata={"client_max": 64, "help": "policy steps between candidates"})
    eval_task: TaskConfig | None = field(default=None, metadata={
        "help": "held-out task (reef_lab.tasks.base.TaskConfig fields) a candidate is scored on; none: no evaluation"})
    eval_size: int = field(default=64, metadata={"client_max": 1024, "help": "held-out items per evaluation"})
    eval_seed: int = field(default=999_983, metadata={"help": "seed of the held-out items (disjoint from training)"})
    retention_task: TaskConfig | None = field(default_factory=lambda: TaskConfig(name="colors"), metadata={
        "help": "a second held-out task every candidate is also scored on, beside the serving release: what a "
                "release keeps (or loses) of what it was not trained on; gating only with retention_tolerance. Default "
                "colors, which the base model mostly gets right; null: off"})
    retention_tolerance: float | None = field(default=None, metadata={"help":
        "refuse a candidate whose retention accuracy is more than this below the serving release's (e.g. 0.1), "
        "whatever the selection (review excepted: a person decides); none: retention never gates"})
    retention_size: int = field(default=32, metadata={"client_max": 1024, "help": "retention items per evaluation"})
    retention_max_tokens: int = field(default=12, metadata={"client_max": 4096,
        "help": "max_tokens of the greedy retention answers"})
    eval_max_tokens: int = field(default=32, metadata={"client_max": 4096,
        "help": "max_tokens of the greedy held-out answers"})
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={
        "help": "reef_lab.trainers.base.TrainerConfig: the optimiser and the backend that trains the policy"})
    episodes: EpisodeConfig = field(default_factory=EpisodeConfig, metadata={
        "help": "reef_lab.learning.episodes.EpisodeConfig: how reports on agent episodes become samples "
                "(samples, mixed_release)"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"selection must be one of {SELECTIONS}, got {self.selection!r}")
        if self.selection in ("no_regression", "strict_gain") and not self.eval_task:
            raise ValueError(f"selection {self.selection!r} compares held-out scores: give an eval_task "
                             "(e.g. {name: arithmetic}) or use selection 'always' or 'review'")
        if self.steps_per_candidate < 1 or self.eval_size < 1 or self.retention_size < 1:
            raise ValueError("steps_per_candidate, eval_size and retention_size must be at least 1")
        if self.retention_tolerance is not None and not (0 <= self.retention_tolerance <= 1 and
                                                         self.retention_task is not None):
            raise ValueError("retention_tolerance must be in [0, 1], with a retention_task to measure it on")


def evolved(recipe) -> set[str]:
    """What a recipe evolves: its own `evolves`, or its components' for a composite."""
    if recipe.evolves == "composite":
        return {c.evolves for c in recipe.components.values()}
    return {recipe.evolves}


def require_score(recipe_name: str, report: dict) -> None:
    """The report schema of the reward-driven recipes: a report that references inferences carries a score."""
    if report.get("references") and report.get("score") is None:
        raise BadRequest(f"the {recipe_name} recipe needs a 'score' on every report that references inferences")


_FOLDER_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def shipped_recipes() -> list[str]:
    """The recipe folders this installation ships (`recipes/<name>/`): the names any client may choose."""
    spec = importlib.util.find_spec("recipes")
    names = set()
    for loc in (spec.submodule_search_locations or []) if spec else []:
        for p in Path(loc).iterdir():
            if p.is_dir() and _FOLDER_RE.match(p.name) and (p / "__init__.py").is_file():
                names.add(p.name)
    return sorted(names)


class RecipeNotOffered(BadRequest):
    pass


def check_offered(spec: object, offered: set[str]) -> str:
    """`spec` when the deployment offers it; clients never name code of their own (a `module:Class` path runs
    code at import), only the shipped folders and what the operator allowed."""
    if not isinstance(spec, str) or spec not in offered:
        raise RecipeNotOffered(f"recipe {spec!r} is not offered by this deployment; choose one of "
                               f"{sorted(offered)} (the server's operator can allow more with --allowed-recipes)")
    return spec


class RecordOnly:
    """Stands in for a scenario's recipe that cannot be built (a stored name this deployment does not offer, or a
    config it now refuses): the scenario keeps serving and recording, its error shows in /reef/status."""

    evolves = "nothing"
    config = None

    def __init__(self, error: str):
        self.name, self.error = "record-only", error

    def validate_report(self, report: dict) -> None:
        return None

    def learner(self, ctx: LearnContext) -> None:
        return None


def _unknown_keys(klass: type, config: dict | None) -> str | None:
    """'unknown field(s) [...]; the fields are [...]' when `config` has keys the recipe's config dataclass lacks."""
    from dataclasses import fields, is_dataclass

    try:
        default = klass().config
    except Exception:  # noqa: BLE001 - a recipe that needs a config to build: Python's own message stays
        return None
    if not is_dataclass(default):
        return None
    names = [f.name for f in fields(default)]
    unknown = sorted(set(config or {}) - set(names))
    return f"unknown field(s) {unknown}; the fields are {names}" if unknown else None


def recipe_path(spec: str) -> str:
    return spec if ":" in spec else f"recipes.{spec}:Recipe"


@functools.lru_cache(maxsize=None)
def recipe_config_class(spec: str) -> type | None:
    """The config dataclass of the recipe `spec` names (None: it has none), read from the recipe built with its
    defaults, so nothing a client sent is used; what reef_lab.schema.check_client_fields walks."""
    config = load_recipe(spec).config
    return type(config) if is_dataclass(config) else None


class RecipeBroken(ReefError):
    """A recipe's own code failed while it was built (not its config): the operator's to fix, so a 500 that names
    the recipe, the error and where it was raised, not an anonymous internal error or a server's traceback."""


def load_recipe(spec: str, config: dict | None = None) -> Recipe:
    klass = recipe_class(spec)
    if not isinstance(klass, type):
        raise BadRequest(f"recipe {spec!r} names a {type(klass).__name__}, not a class; name a recipe class (the "
                         "members of reef_lab.learning.recipe.Recipe, docs/extending.md)")
    try:
        recipe = klass(**(config or {}))
    except TypeError as e:  # most likely a key the config has no field for: name it, with the fields it has
        raise BadRequest(f"recipe {spec!r}: the recipe's config does not fit: {_unknown_keys(klass, config) or e}") \
            from e
    except ValueError as e:
        raise BadRequest(f"recipe {spec!r}: the recipe's config does not fit: {e}") from e
    except ReefError:
        raise
    except Exception as e:  # noqa: BLE001 - a plug-in's own bug, reported with where it is
        frame = traceback.extract_tb(e.__traceback__)[-1]
        raise RecipeBroken(f"recipe {spec!r} failed while it was built: {type(e).__name__}: {e} (raised at "
                           f"{frame.filename}:{frame.lineno}); the recipe's code must be fixed, its config is not "
                           "at fault (a recipe written for an earlier reef_lab: see docs/extending.md)") from e
    if not isinstance(recipe, Recipe):
        raise BadRequest(f"recipe {spec!r} ({klass.__module__}.{klass.__name__}) is not a recipe: it needs the members "
                         "of reef_lab.learning.recipe.Recipe (name, evolves, config, validate_report, learner; "
                         "docs/extending.md)")
    if recipe.evolves not in EVOLVES:
        raise BadRequest(f"recipe {spec!r} declares evolves={recipe.evolves!r}; it must be one of {EVOLVES}")
    return recipe
