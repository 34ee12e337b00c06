"""`composite`: one scenario, several named components that each evolve with their own recipe and learner, released
together: a release is a manifest of component versions, and a rollback restores all of them.

    recipe_config: {components: {weights: {recipe: sft, config: {...}}, harness: {recipe: gepa, config: {...}}}}

A component is named by what it evolves (`weights`: a recipe that trains the served model; `harness`: one that
evolves the prompts, rules and skills) and may be given as a bare recipe name (`weights: sao`). Every report goes to
every component's learner (each takes what its recipe reads: a score, feedback, a reference answer). When one
component's learner releases, the releaser (reef_lab.publishing.releaser) makes release vN+1 with that component's
new version and the others as they serve; `GET /reef/harness`, the `x-reef-release-components` header and each Hub
revision's manifest.json name the versions.

A harness component whose task model is left to the deployment's (`task_lm` unset) calls the scenario's serving
weights, so GEPA scores its candidates on the model the scenario serves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from reef_lab.errors import BadRequest, Conflict
from reef_lab.engines.lm import EngineLM
from reef_lab.learning.recipe import LearnContext, load_recipe, recipe_config_class, shipped_recipes
from reef_lab.schema import build, check_fields

COMPONENTS = ("weights", "harness")


def component_config_class(spec: dict) -> type | None:
    """The config dataclass of the recipe a component names: what a client may set in its `config`, field by field
    (reef_lab.schema.check_client_fields), exactly as if it had named that recipe itself."""
    recipe = spec.get("recipe")
    if not isinstance(recipe, str) or recipe not in shipped_recipes() or recipe == "composite":
        raise ValueError(f"recipe must be a recipe folder of recipes/ other than composite ({shipped_recipes()}), got "
                         f"{recipe!r}")
    return recipe_config_class(recipe)


@dataclass
class ComponentSpec:
    recipe: str = field(metadata={"help": "a recipe folder of recipes/ that evolves what the component's name says"})
    config: dict = field(default_factory=dict, metadata={
        "help": "that recipe's config (its own fields)", "schema_by": component_config_class})


@dataclass
class CompositeConfig:
    components: dict[str, str | ComponentSpec] = field(
        default_factory=lambda: {"weights": "sft", "harness": "gepa"}, metadata={
            "help": "component name (weights, harness) -> a recipe folder name, or {recipe, config}; the recipe must "
                    "evolve what the name says"})

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.components or set(self.components) - set(COMPONENTS):
            raise ValueError(f"components must name some of {list(COMPONENTS)}, got {sorted(self.components)}")
        for name in self.components:
            self.recipe_of(name)

    def spec(self, name: str) -> tuple[str, dict]:
        value = self.components[name]
        if isinstance(value, str):
            return value, {}
        if not isinstance(value, dict) or set(value) - {"recipe", "config"} or not isinstance(value.get("recipe"), str):
            raise ValueError(f"components.{name} must be a recipe name or {{recipe, config}}, got {value!r}")
        spec = build(ComponentSpec, value, f"components.{name}")
        return spec.recipe, dict(spec.config or {})

    def recipe_of(self, name: str):
        spec, config = self.spec(name)
        if ":" in spec or spec == "composite":
            raise ValueError(f"components.{name}.recipe must be a recipe folder of recipes/ other than composite, "
                             f"got {spec!r}")
        try:
            recipe = load_recipe(spec, config)
        except BadRequest as e:
            raise ValueError(f"components.{name}: {e.message}") from None
        if recipe.evolves != name:
            raise ValueError(f"components.{name}: recipe {spec!r} evolves {recipe.evolves}, not {name}")
        return recipe


class CompositeRecipe:
    name = "composite"
    evolves = "composite"

    def __init__(self, **config):
        self.config = CompositeConfig(**config)
        self.components = {name: self.config.recipe_of(name) for name in self.config.components}

    def validate_report(self, report: dict) -> None:
        for recipe in self.components.values():
            recipe.validate_report(report)

    def learner(self, ctx: LearnContext):
        return CompositeLearner(ctx, self)

    @staticmethod
    def run_experiment(data: dict, progress: bool = True) -> dict:
        raise ValueError("the composite recipe runs live (a server's scenario); run an experiment per component")


class CompositeLearner:
    """The components' learners side by side, each with its own state folder; what it is asked goes to each."""

    def __init__(self, ctx: LearnContext, recipe: CompositeRecipe):
        self.ctx, self.recipe = ctx, recipe
        ctx.releaser.declare_components(ctx.scenario, list(recipe.components))

        def make_lm(spec: dict | None):  # the deployment's own model is the scenario's serving weights here
            return ctx.make_lm(spec) if spec else EngineLM(ctx.engine, scenario=ctx.scenario)
        self.parts = {}
        for name, part in sorted(recipe.components.items()):  # harness first: its seed serves from the start
            self.parts[name] = part.learner(replace(ctx, state_dir=ctx.state_dir / name, make_lm=make_lm))

    @property
    def last_error(self) -> str | None:
        errors = [f"{name}: {ln.last_error}" for name, ln in self.parts.items() if ln.last_error]
        return "; ".join(errors) or None

    def on_record(self, record: dict) -> None:
        for ln in self.parts.values():
            ln.on_record(record)

    def request_training(self) -> dict:
        out, refusals = {}, []
        for name, ln in self.parts.items():
            try:
                out[name] = ln.request_training()
            except Conflict as e:
                refusals.append(f"{name}: {e.message}")
                out[name] = {"queued": False, "reason": e.message}
        if not any(v.get("queued", True) for v in out.values()):
            raise Conflict("no component can train now: " + "; ".join(refusals))
        return {"scenario": self.ctx.scenario, "queued": True, "components": out}

    def request_change(self, body: dict) -> dict:
        """A change request in plain words is the harness component's (its release joins the composite's next
        manifest); a composite without one refuses it like any scenario that evolves no harness."""
        if "harness" not in self.parts:
            raise Conflict(f"composite scenario {self.ctx.scenario!r} has no harness component; change requests "
                           "({\"text\": ...} on POST /reef/train) go to a harness component (recipe gepa)")
        return {**self.parts["harness"].request_change(body), "component": "harness"}

    def promote(self, candidate: str) -> dict:
        component = self.ctx.releaser.candidate(self.ctx.scenario, candidate).get("component")
        if component not in self.parts:
            raise Conflict(f"candidate {candidate} belongs to no component of this scenario")
        return self.parts[component].promote(candidate)

    def on_rollback(self) -> None:
        for ln in self.parts.values():
            ln.on_rollback()

    def wait_idle(self, timeout: float = 600.0) -> bool:
        return all(ln.wait_idle(timeout) for ln in self.parts.values())

    def status(self) -> dict:
        return {"recipe": "composite", "components": {name: ln.status() for name, ln in self.parts.items()}}

    def close(self) -> None:
        for ln in self.parts.values():
            ln.close()
