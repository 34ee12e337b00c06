"""Experiments: a task stream (or a search, or a discovery loop) driven through the gateway in-process, so an offline
run and live traffic exercise one code path. driver.py holds what every family shares; weights.py is the weight
recipes' family; recipes/gepa and recipes/tttd bring their own on the same driver."""

from __future__ import annotations


def run(data: dict, progress: bool = True) -> dict:
    """Run (or resume) the experiment a YAML mapping describes (scripts/run_experiment.py): a weight recipe's on
    reef_lab.experiments.weights, any other recipe's by its own `run_experiment`."""
    from reef_lab.learning.learner import WeightRecipe
    from reef_lab.learning.recipe import recipe_class

    cls = recipe_class(data["recipe"])
    if issubclass(cls, WeightRecipe):
        from reef_lab.experiments.weights import ExperimentConfig, run_experiment

        return run_experiment(ExperimentConfig.parse(data), progress=progress)
    return cls.run_experiment(data, progress=progress)
