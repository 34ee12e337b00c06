"""Each scenario's recipe and learner: built on first use, kept, closed with the scenario.

A recipe that cannot be built (a stored name this deployment does not offer, a config it now refuses), or a
learner that fails to start, becomes the scenario's error (in /reef/status): the scenario keeps serving and
recording, and the client that triggered it is never blamed for it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from typing import Callable

from reef_lab.engines.base import Generator, ReleaseHost
from reef_lab.engines.lm import make_lm
from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.errors import BadRequest, Conflict, ReefError
from reef_lab.learning.recipe import LearnContext, Recipe, RecordOnly, ScenarioLearner, check_offered, evolved, \
    load_recipe, recipe_config_class
from reef_lab.publishing.tracking import Tracker, TrackingConfig
from reef_lab.schema import check_client_fields

log = logging.getLogger("reef_lab.gateway.learners")


LEASE = "learner:"  # a scenario's learner lease: learner:<scenario>


class Learners:
    """`learns`: whether this process runs learners at all (False: a gateway service of a shared deployment);
    `leases`: in a shared deployment, the LeaseKeeper (reef_lab/state/postgres.py) that makes one learner per
    scenario in the whole deployment: a scenario whose lease another service holds learns there, not here."""

    def __init__(self, engine, scenarios, offered: set[str], tracking: TrackingConfig | None,
                 context: Callable[[str, Recipe, Tracker | None], LearnContext], data_dir, hub=None,
                 learns: bool = True, leases=None):
        self.engine, self.scenarios, self.offered, self.tracking = engine, scenarios, offered, tracking
        self.data_dir, self.hub = data_dir, hub
        self.learns, self.leases = learns, leases
        self._context = context
        self.errors: dict[str, str] = {}  # scenario -> why its recipe or learner cannot be built
        self._recipes: dict[str, Recipe] = {}
        self._learners: dict[str, ScenarioLearner] = {}
        self._default: Recipe | None = None  # the deployment's recipe, for scenarios about to be created
        self._lock = threading.Lock()

    def check_engine_fits(self, recipe) -> None:
        if "weights" in evolved(recipe) and not isinstance(self.engine, ReleaseHost):
            raise Conflict(f"recipe {recipe.name!r} trains model weights, which this engine (an upstream provider) "
                           "cannot serve: use the embedded model (no --upstream-url) or a recipe that does not "
                           "train weights")

    def recipe(self, name: str) -> Recipe:
        """The scenario's recipe; one that cannot be built (a stored name this deployment does not offer, a config
        it refuses) leaves the scenario serving and recording with the error in /reef/status."""
        r = self._recipes.get(name)
        if r is None:
            s = self.scenarios.get(name)
            try:
                spec = check_offered(s.recipe, self.offered)
                if s.origin != "operator":  # a client's config, read back: as refused as when it was sent
                    self.check_client_config(spec, s.config)
                r = load_recipe(spec, s.config)
            except ReefError as e:
                self.errors[name] = f"recipe {s.recipe!r} cannot be built: {e.message}"
                log.error("scenario %s serves and records without learning: %s", name, self.errors[name])
                r = RecordOnly(self.errors[name])
            self._recipes[name] = r
        return r

    def recipe_for(self, name: str) -> Recipe:
        """The recipe of scenario `name`, or for a name not created yet the one it will have (the deployment's)."""
        if self.scenarios.exists(name):
            return self.recipe(name)
        if self._default is None:
            self._default = load_recipe(self.scenarios.default_recipe, self.scenarios.default_config)
        return self._default

    def check_client_config(self, spec: str, config: dict | None) -> None:
        """BadRequest when a client's recipe config names code or sets an operator-only field (reef_lab.schema)."""
        try:
            check_client_fields(recipe_config_class(spec), config or {})
        except ValueError as e:
            raise BadRequest(str(e)) from None

    def serves_from_start(self, name: str) -> bool:
        """Whether the scenario's learner starts with the scenario (a harness recipe's seed serves from the first
        request; a composite's components too)."""
        return self.recipe(name).evolves in ("harness", "composite")

    def here(self, name: str) -> bool:
        """Whether the scenario's learner runs in this process (taking its lease if it is free)."""
        return self.learns and (self.leases is None or self.leases.claim(LEASE + name))

    def elsewhere(self, name: str) -> bool:
        """Whether another service of a shared deployment learns the scenario (or would: a gateway service)."""
        return name not in self._learners and not self.here(name)

    def start(self, name: str, record: dict | None = None) -> None:
        """Build (or reach) the scenario's learner and hand it a stored record. The record is stored already, so a
        learner that cannot be built is the scenario's error (in /reef/status), never the client's. In a shared
        deployment a scenario another service learns is left to it (it hears of the record from the database)."""
        if name not in self._learners and not self.here(name):
            return
        try:
            if self.recipe(name).evolves != "nothing":
                ln = self.learner(name)
                if record is not None:
                    ln.on_record(record)
        except Exception as e:  # noqa: BLE001 - kept as the scenario's error; serving and recording go on
            self.errors[name] = f"the learner cannot run: {type(e).__name__}: {e.message if isinstance(e, ReefError) else e}"
            log.exception("scenario %s: %s", name, self.errors[name])

    def learner(self, name: str) -> ScenarioLearner:
        """The scenario's learner, built by its recipe on first use (a harness recipe's publishes its seed)."""
        ln = self._learners.get(name)
        if ln is None and not self.here(name):
            raise Conflict(f"scenario {name!r} learns in another service of this deployment (the learner holding "
                           f"its lease: {self.holder(name) or 'none yet'}): ask that service, or try again if it "
                           "just went down (another takes its scenarios over within 30 s)")
        if ln is None:
            with self._lock:
                ln = self._learners.get(name)
                if ln is None:
                    recipe = self.recipe(name)
                    ln = recipe.learner(self._context(name, recipe, self._tracker(name, recipe)))
                    if ln is None:
                        raise BadRequest(f"scenario {name!r} uses recipe {recipe.name!r}, which does not train "
                                         "(it learns nothing)")
                    self._learners[name] = ln
        return ln

    def running(self, name: str) -> ScenarioLearner | None:
        """The scenario's learner if it has been built (None: never built, or not a learning recipe)."""
        return self._learners.get(name)

    def _tracker(self, name: str, recipe) -> Tracker | None:
        """A W&B run for a learning scenario (None when tracking is off)."""
        if self.tracking is None or self.tracking.resolved_mode() == "disabled":
            return None
        tracker = Tracker(self.tracking.name or name, {
            "scenario": name, "recipe": recipe.name, "recipe_config": asdict(recipe.config),
            "engine": self.engine.info().get("model_name"), "data_dir": str(self.data_dir),
            **self.tracking.extra_config}, self.tracking, self.data_dir)
        if self.hub is not None:
            self.hub.links[name] = lambda t=tracker: t.link
        return tracker

    def make_lm(self, spec: dict | None):
        """An LM a recipe calls (judge, reflection, task model); None: the deployment's own model, i.e. the
        generating engine, or the upstream provider through its OpenAI API."""
        if spec:
            return make_lm(spec, self.engine)
        if isinstance(self.engine, Generator):
            return make_lm({"kind": "engine"}, self.engine)
        if not self.engine.model:
            raise Conflict("the gepa recipe calls the upstream model itself: start with --upstream-model, or give "
                           "the recipe a task_lm {kind: openai, base_url, model}")
        if isinstance(self.engine, UpstreamEngine) and self.engine.key_from_client and not self.engine.api_key:
            raise Conflict("this recipe calls the upstream provider itself (task model, reflection, change-request "
                           "proposer), and the deployment holds no provider key (--upstream-key-from-client without "
                           "REEF_UPSTREAM_API_KEY: only clients' own requests carry a key): set REEF_UPSTREAM_API_KEY "
                           "for the server's own calls, or give the recipe's LMs a key_env in --recipe-config")
        return make_lm({"kind": "openai", "base_url": self.engine.base_url, "model": self.engine.model})

    def holder(self, name: str) -> str | None:
        """Which service holds the scenario's learner lease (shared deployments; None: none, or not shared)."""
        if self.leases is None:
            return None
        return self.leases.state.lease_holders(LEASE + name).get(LEASE + name)

    def lost(self, lease: str) -> None:
        """The lease of a scenario's learner ran out before this process renewed it: another service may have
        taken it, so the learner stops here (its writes are fenced already)."""
        if lease.startswith(LEASE):
            ln = self._learners.pop(lease[len(LEASE):], None)
            if ln is not None:
                ln.close()

    def forget(self, name: str) -> None:
        """A deleted scenario: its recipe, error and learner go."""
        self._recipes.pop(name, None)
        self.errors.pop(name, None)
        ln = self._learners.pop(name, None)
        if ln is not None:
            ln.close()
        if self.leases is not None:
            self.leases.drop(LEASE + name)

    def built(self) -> dict[str, ScenarioLearner]:
        """The learners built so far, by scenario (a snapshot)."""
        with self._lock:
            return dict(self._learners)

    def status(self) -> dict:
        return {n: ln.status() for n, ln in list(self._learners.items())}

    def close(self) -> None:
        for ln in list(self._learners.values()):
            ln.close()
        if self.leases is not None:
            self.leases.close()
