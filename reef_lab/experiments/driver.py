"""What every experiment family shares: a run folder, an engine, the experiment's scenario on a gateway over the
folder's data dir (reached through an ExperimentContext, never the gateway itself), tracking and Hub settings,
`config.json` at the start and `summary.json` at the end.

A family (weights: reef_lab.experiments.weights; GEPA: recipes/gepa/experiment.py; TTT-Discover:
recipes/tttd/experiment.py) subclasses ExperimentDriver and writes its loop in `loop()`, which opens its scenario
with `open()` and uses only the context that returns; its config derives from RunConfig. Running the same command
again resumes: the data dir, the scenario and the loop's own state are kept.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from reef_lab.files import write_json
from reef_lab.publishing.hub import HubConfig
from reef_lab.publishing.tracking import TrackingConfig
from reef_lab.schema import check_fields

if TYPE_CHECKING:  # the gateway loads when a loop opens its scenario, not when a config is read
    from reef_lab.service import ExperimentContext

log = logging.getLogger("reef_lab.experiments")


@dataclass
class RunConfig:
    """The fields every experiment has; a family's config derives from this and adds its own."""

    name: str = field(default="experiment", metadata={"help": "run name (also the scenario's name)"})
    recipe: str = field(default="sao", metadata={"help": "recipe: a folder in recipes/ or module:Class"})
    seed: int = field(default=0, metadata={"help": "seed of the run (sampling, the trainer, the search)"})
    model_path: str | None = field(default=None, metadata={"help": "model (default: the embedded SmolLM2)"})
    engine: str = field(default="auto", metadata={
        "help": "the engine that generates the rollouts: auto (vllm when `bash scripts/setup.sh --vllm` has installed "
                "it, the model is the default one and the recipe trains LoRA, which vLLM's weight reload needs; "
                "else embedded), embedded, vllm or module:Class (reef_lab.engines)"})
    engine_options: dict = field(default_factory=dict, metadata={"help": "the engine's own settings"})
    out_dir: str | None = field(default=None, metadata={"help": "run folder (default: runs/<name>-seed<seed>)"})
    wandb: dict = field(default_factory=dict, metadata={
        "help": "reef_lab.publishing.tracking.TrackingConfig fields (project, entity, group, mode); the run is named "
                "after the experiment and seed, grouped by the experiment's name", "schema": TrackingConfig})
    hub: dict = field(default_factory=dict, metadata={
        "help": "publish releases to the Hub: reef_lab.publishing.hub.HubConfig fields, e.g. {repo: me/reef-{scenario}}",
        "schema": HubConfig})

    def check_run(self) -> None:
        """Every field at every depth, and the engine resolved with its options: a typo fails here, before any
        model loads. A family's __post_init__ calls this first."""
        check_fields(self)
        if self.engine != "auto":
            from reef_lab.engines import engine_class

            engine_class(self.engine).check_options(self.engine_options)

    @classmethod
    def parse(cls, data: dict):
        """The config a YAML mapping describes; an unknown key is named with the fields there are."""
        from reef_lab.schema import build

        return build(cls, data, "experiment")

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir or f"runs/{self.name}-seed{self.seed}")


def choose_engine(model_path: str | None, lora: bool) -> tuple[str, str]:
    """`engine: auto`: the fastest rollout path this machine has for the run (results/engines.md: vLLM CPU
    generates 3.5x the embedded engine's tokens/s at 32 concurrent), and why."""
    from reef_lab.engines.vllm import DEFAULT_PYTHON

    if not DEFAULT_PYTHON.is_file():
        return "embedded", "vLLM is not installed: bash scripts/setup.sh --vllm"
    if model_path is not None:
        return "embedded", "model_path is set; name engine: vllm to serve it with vLLM"
    if not lora:
        return "embedded", "the recipe trains full weights; vLLM's in-place reload needs trainer.lora_rank > 0"
    return "vllm", "installed in .venv-vllm, default model, LoRA training"


class ExperimentDriver(ABC):
    """One run of a family's loop: `run()` writes config.json, builds what the loop needs on first use, runs
    `loop()`, writes summary.json and closes what it built."""

    def __init__(self, cfg: RunConfig, engine=None, close_engine: bool | None = None):
        self.cfg = cfg
        self.engine = engine
        self.engine_name = cfg.engine  # what `auto` chose, once an engine is built
        self._close_engine = engine is None if close_engine is None else close_engine
        self.ctx: ExperimentContext | None = None  # the scenario's deployment, once `open()` built it
        self.owned: list = []  # what else the loop built and the run closes (a tracker, a serving engine)

    @property
    def run_dir(self) -> Path:
        return self.cfg.run_dir

    def run(self, progress: bool = True) -> dict:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "config.json", asdict(self.cfg), indent=True)  # what was asked (engine: auto)
        try:
            summary = self.loop(progress)
            if self.ctx is not None:
                self.ctx.wait_published(600)
            write_json(self.run_dir / "summary.json", summary, indent=True)
            return summary
        finally:
            self.close()

    @abstractmethod
    def loop(self, progress: bool) -> dict:
        """The family's loop; its summary."""

    # ---- what a loop builds on first use ------------------------------------------------------------------
    def build_engine(self, max_batch: int, lora: bool):
        """The run's engine (given, or built from the config: `auto` picks one and logs why)."""
        if self.engine is None:
            from reef_lab.config import ServeConfig
            from reef_lab.engines import engine_class

            if self.cfg.engine == "auto":
                self.engine_name, why = choose_engine(self.cfg.model_path, lora)
                log.info("rollouts on the %s engine (%s)", self.engine_name, why)
            opts = orjson.dumps(self.cfg.engine_options).decode() if self.cfg.engine_options else None
            serve = ServeConfig(engine=self.engine_name, model_path=self.cfg.model_path, max_batch=max(max_batch, 1),
                                engine_options=opts)
            self.engine = engine_class(self.engine_name).from_config(serve)
        return self.engine

    def open(self, engine, scenario_config: dict | None = None, tracking: bool = True) -> ExperimentContext:
        """The experiment's scenario on a gateway over the run's data dir (created with the recipe and
        `scenario_config` unless it exists: a resumed run), as the context the loop uses (reef_lab.service)."""
        from reef_lab.service import open_experiment

        cfg = self.cfg
        hub = HubConfig(**cfg.hub) if cfg.hub.get("repo") else None
        tc = TrackingConfig(**{"group": cfg.name, "name": f"{cfg.name}-seed{cfg.seed}",
                               "extra_config": {"experiment": asdict(cfg)}, **cfg.wandb}) if tracking else None
        self.ctx = open_experiment(self.run_dir / "data", engine, cfg.name, cfg.recipe, scenario_config, hub=hub,
                                   tracking=tc)
        return self.ctx

    def close(self) -> None:
        for thing in reversed(self.owned):
            thing.close()
        if self.ctx is not None:
            self.ctx.close()
        if self.engine is not None and self._close_engine:
            self.engine.close()
