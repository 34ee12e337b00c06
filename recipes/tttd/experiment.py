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


from reef_lab.experiments.driver import ExperimentDriver, RunConfig
from reef_lab.learning.heartbeat import Heartbeat

from .config import TTTDConfig

log = logging.getLogger("recipes.tttd")


@dataclass
class TTTDExperimentConfig(RunConfig):
    name: str = field(default="tttd", metadata={"help": "run name (also the scenario's name)"})
    recipe: str = field(default="tttd", metadata={"help": "this recipe (the YAML names it)"})
    config: dict = field(default_factory=dict, metadata={
        "help": "recipes.tttd.config.TTTDConfig fields (the paper's choices)", "schema": TTTDConfig})

    def __post_init__(self) -> None:
        self.check_run()
        if self.recipe != "tttd":
            raise ValueError(f"this is the tttd experiment; recipe is {self.recipe!r}")
        self.recipe_config()

    def recipe_config(self) -> TTTDConfig:
        return TTTDConfig(**{"seed": self.seed, **self.config, "mode": "manual"})


def run_tttd_experiment(cfg: TTTDExperimentConfig, engine=None, progress: bool = True,
                        close_engine: bool = True) -> dict:
    """Run (or resume) the experiment; returns its summary (also written to summary.json). `close_engine`: False
    keeps a given engine running for the next run. Its heartbeat (reef_lab.learning.heartbeat) tells apps/ttt.py it
    runs while it writes nothing else."""
    with Heartbeat(cfg.run_dir):
        return TTTDExperiment(cfg, engine, close_engine).run(progress)


class TTTDExperiment(ExperimentDriver):
    cfg: TTTDExperimentConfig

    def loop(self, progress: bool) -> dict:
        cfg, rc = self.cfg, self.cfg.recipe_config()
        engine = self.build_engine(rc.concurrency, lora=rc.trainer.lora_rank > 0)
        learner = self.open(engine, asdict(rc)).learner()
        summary = learner.discovery.run(progress=progress)
        return {"name": cfg.name, "seed": cfg.seed, "engine": self.engine_name, **summary,
                "wandb": learner.ctx.tracker.link if learner.ctx.tracker is not None else None}
