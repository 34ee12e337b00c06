"""`tttd`: TTT-Discover (arXiv 2601.16175), test-time RL on one problem with a continuous reward: the policy keeps
improving its best solution. Live, a scenario with this recipe runs the loop on the server (recipes/tttd/learner.py);
as an experiment, `python scripts/run_experiment.py recipes/tttd/examples/circle_packing_cpu.yaml`
(recipes/tttd/experiment.py). The loop itself: recipes/tttd/discover.py.
"""

from __future__ import annotations

from reef_lab.errors import BadRequest
from reef_lab.learning.recipe import LearnContext

from .config import TTTDConfig
from .problems import make_problem


class TTTDRecipe:
    name = "tttd"
    evolves = "weights"

    def __init__(self, **config):
        self.config = TTTDConfig(**config)
        # Built once here so that a problem that cannot be made (a machine without the sandbox it needs, with the
        # fix named) stops the server at start or refuses the scenario, not its first step.
        make_problem(self.config.problem_config)

    def validate_report(self, report: dict) -> None:
        score = report.get("score")
        if score is not None and (not isinstance(score, (int, float)) or isinstance(score, bool)):
            raise BadRequest("score must be a number")

    def learner(self, ctx: LearnContext):
        from .learner import TTTDLearner

        return TTTDLearner(ctx, self.config)

    @staticmethod
    def run_experiment(data: dict, progress: bool = True) -> dict:
        from .experiment import TTTDExperimentConfig, run_tttd_experiment

        return run_tttd_experiment(TTTDExperimentConfig.parse(data), progress=progress)
