"""TTT-Discover as an experiment: `python scripts/run_experiment.py recipes/tttd/examples/circle_packing_cpu.yaml`.

A run folder (`runs/<name>-seed<seed>` unless `out_dir`) holds a data dir whose scenario `<name>` has recipe `tttd`;
the loop samples through that gateway exactly as live traffic would. Re-running the same command resumes at the
next step. Progress shows as a bar with the best reward so far; metrics go to `learn/<name>/metrics.jsonl` and W&B;
the best solution ends as `best_solution.py`, in the final release's folder and as a W&B artifact; apps/ttt.py
plots the run.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from reef_lab.files import write_json
from reef_lab.gateway.gateway import Gateway
from reef_lab.learning.heartbeat import Heartbeat
from reef_lab.schema import check_fields

from .config import TTTDConfig

log = logging.getLogger("recipes.tttd")


@dataclass
class TTTDExperimentConfig:
    recipe: str = field(default="tttd", metadata={"help": "this recipe (the YAML names it)"})
    name: str = field(default="tttd", metadata={"help": "run name (also the scenario's name)"})
    seed: int = field(default=0, metadata={"help": "seed of the sampling and the trainer"})
    config: dict = field(default_factory=dict, metadata={
        "help": "recipes.tttd.config.TTTDConfig fields (the paper's choices)", "schema": TTTDConfig})
    model_path: str | None = field(default=None, metadata={"help": "model (default: the embedded SmolLM2)"})
    engine: str = field(default="auto", metadata={
        "help": "rollout engine: auto (vllm when installed, since TTT-Discover trains LoRA; else embedded), "
                "embedded, vllm or module:Class"})
    engine_options: dict = field(default_factory=dict, metadata={"help": "the engine's own settings"})
    out_dir: str | None = field(default=None, metadata={"help": "run folder (default: runs/<name>-seed<seed>)"})
    wandb: dict = field(default_factory=dict, metadata={
        "help": "reef_lab.publishing.tracking.TrackingConfig fields (project, entity, mode)"})
    hub: dict = field(default_factory=dict, metadata={
        "help": "push the final release to the Hub: reef_lab.publishing.hub.HubConfig fields"})

    def __post_init__(self) -> None:
        check_fields(self)
        if self.recipe != "tttd":
            raise ValueError(f"this is the tttd experiment; recipe is {self.recipe!r}")
        self.recipe_config()

    def recipe_config(self) -> TTTDConfig:
        return TTTDConfig(**{"seed": self.seed, **self.config, "mode": "manual"})

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir or f"runs/{self.name}-seed{self.seed}")


def run_tttd_experiment(cfg: TTTDExperimentConfig, engine=None, progress: bool = True,
                        close_engine: bool = True) -> dict:
    """Run (or resume) the experiment; returns its summary (also written to summary.json). `close_engine`: False
    keeps a given engine running for the next run. Its heartbeat (reef_lab.learning.heartbeat) tells apps/ttt.py it
    runs while it writes nothing else."""
    with Heartbeat(cfg.run_dir):
        return _run_tttd_experiment(cfg, engine, progress, close_engine)


def _run_tttd_experiment(cfg: TTTDExperimentConfig, engine, progress: bool, close_engine: bool) -> dict:
    from reef_lab.learning.experiment import ExperimentConfig, choose_engine

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    rc = cfg.recipe_config()
    if engine is None:
        from reef_lab.config import ServeConfig
        from reef_lab.engines import engine_class

        if cfg.engine == "auto":
            cfg.engine, why = choose_engine(ExperimentConfig(recipe="sft", model_path=cfg.model_path,
                                                             recipe_config={"trainer": rc.trainer}))
            log.warning("rollouts on the %s engine (%s)", cfg.engine, why)
        serve = ServeConfig(engine=cfg.engine, model_path=cfg.model_path, max_batch=max(rc.concurrency, 1),
                            engine_options=orjson.dumps(cfg.engine_options).decode() if cfg.engine_options else None)
        engine = engine_class(cfg.engine).from_config(serve)
    write_json(run_dir / "config.json", asdict(cfg), indent=True)
    from reef_lab.publishing.hub import HubConfig
    from reef_lab.publishing.tracking import TrackingConfig

    tracking = TrackingConfig(**{"group": cfg.name, "name": f"{cfg.name}-seed{cfg.seed}",
                                 "extra_config": {"experiment": asdict(cfg)}, **cfg.wandb})
    hub = HubConfig(**cfg.hub) if cfg.hub.get("repo") else None
    gw = Gateway(run_dir / "data", engine, default_recipe="basic", hub=hub, tracking=tracking,
                 allowed_recipes=["tttd"])
    try:
        if cfg.name not in {s.name for s in gw.scenarios.list()}:
            gw.create_scenario({"name": cfg.name, "recipe": "tttd", "config": asdict(rc)}, operator=True)
        learner = gw.learner(cfg.name)
        summary = learner.discovery.run(progress=progress)
        if gw.hub is not None:
            gw.hub.wait(timeout=600)
        summary = {"name": cfg.name, "seed": cfg.seed, "engine": cfg.engine, **summary,
                   "wandb": learner.ctx.tracker.link if learner.ctx.tracker is not None else None}
        write_json(run_dir / "summary.json", summary, indent=True)
        return summary
    finally:
        gw.close(close_engine=close_engine)
