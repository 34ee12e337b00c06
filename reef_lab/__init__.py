"""reef_lab: the SDK a notebook and a plug-in hold on to. `import reef_lab` gives the names below, each imported from
its home on first use, so the import itself stays light (no torch, transformers or flask: tests/test_sdk.py).

    import reef_lab
    reef_lab.__version__
    summary = reef_lab.run_experiment(yaml.safe_load(open("recipes/sao/examples/arithmetic.yaml")))
    run = reef_lab.read_run("runs/sao-arithmetic-seed0")  # config, summary, release index, metrics (polars)
    run.events("candidate"); run.records().collect()      # the learner's candidate rows; the run's records
    reef_lab.compare_runs(["runs/a", "runs/b"])            # one row per run: recipe, seed, accuracies, retention
    reef_lab.scan_records(".reef_lab")                     # a data dir's records as one polars LazyFrame

A plug-in (docs/extending.md) derives from `reef_lab.WeightRecipe` or `reef_lab.Task`, `reef_lab.Trainer`,
`reef_lab.Generator` ... The subpackages stay importable (`reef_lab.tasks.base` and so on); these names are the ones
that keep their meaning across releases: a name that moves keeps working for a release with a DeprecationWarning
naming its new home (reef_lab/_moved.py), and CHANGELOG.md says what changed.
"""

from reef_lab import _moved

# Public name -> its home: the module that defines it (tests/test_sdk.py holds the frozen list). `module:attribute`
# where the name differs there.
_HOMES = {
    # recipes and their configs (docs/extending.md)
    "Recipe": "reef_lab.learning.recipe",
    "ScenarioLearner": "reef_lab.learning.recipe",
    "LearnConfig": "reef_lab.learning.recipe",
    "LearnContext": "reef_lab.learning.recipe",
    "load_recipe": "reef_lab.learning.recipe",
    "recipe_class": "reef_lab.learning.recipe",
    "require_score": "reef_lab.learning.recipe",
    "WeightRecipe": "reef_lab.learning.learner",
    # samples and losses
    "Sample": "reef_lab.trainers.samples",
    "InvalidSamples": "reef_lab.trainers.samples",
    "Loss": "reef_lab.trainers.base",
    "SequenceLoss": "reef_lab.trainers.base",
    "require_sequence_losses": "reef_lab.trainers.base",
    # tasks
    "Task": "reef_lab.tasks.base",
    "VerifiedTask": "reef_lab.tasks.base",
    "TaskConfig": "reef_lab.tasks.base",
    "make_task": "reef_lab.tasks.base",
    "ToolTask": "reef_lab.tasks.tools",
    # trainers
    "Trainer": "reef_lab.trainers.base",
    "TrainerConfig": "reef_lab.trainers.base",
    "SequenceLossTrainer": "reef_lab.trainers.base",
    "make_trainer": "reef_lab.trainers",
    # engines: the capability protocols and what they exchange
    "Engine": "reef_lab.engines.base",
    "Generator": "reef_lab.engines.base",
    "Relay": "reef_lab.engines.base",
    "ReleaseHost": "reef_lab.engines.base",
    "YieldsToTraining": "reef_lab.engines.base",
    "ChatRequest": "reef_lab.engines.base",
    "SamplingParams": "reef_lab.engines.base",
    "Generation": "reef_lab.engines.base",
    "GenerationStream": "reef_lab.engines.base",
    # serving in-process
    "Gateway": "reef_lab.gateway.gateway",
    "ServeConfig": "reef_lab.config",
    "build_engine": "reef_lab.service",
    "build_gateway": "reef_lab.service",
    # experiments: running one, and what a recipe's own experiment builds on
    "run_experiment": "reef_lab.experiments:run",
    "ExperimentConfig": "reef_lab.experiments.weights",
    "ExperimentDriver": "reef_lab.experiments.driver",
    "RunConfig": "reef_lab.experiments.driver",
    "ExperimentContext": "reef_lab.service",
    # reading runs and records as polars frames, comparing runs
    "Run": "reef_lab.experiments.runs",
    "read_run": "reef_lab.experiments.runs",
    "compare_runs": "reef_lab.experiments.runs",
    "read_metrics": "reef_lab.learning.learner",
    "scan_records": "reef_lab.records.segments",
    "scenario_frames": "reef_lab.publishing.export",
    # errors a plug-in raises (a report that does not fit: BadRequest)
    "ReefError": "reef_lab.errors",
    "BadRequest": "reef_lab.errors",
}

__all__ = list(_HOMES)

_moved.install(__all__)  # the old module paths (reef_lab.learning.samples, ...) resolve, with a warning, until 0.3.0


def __getattr__(name: str):
    if name == "__version__":
        from importlib.metadata import version

        value = version("reef-lab")  # pyproject.toml's, as installed (bash scripts/setup.sh: pip install -e .)
    elif name in _HOMES:
        module, _, attr = _HOMES[name].partition(":")
        from importlib import import_module

        value = getattr(import_module(module), attr or name)
    else:
        raise AttributeError(f"module 'reef_lab' has no attribute {name!r}")
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
