"""Build a running gateway: from a ServeConfig (the server: the engine it names, the store in its data dir), or for
an experiment (its run folder's data dir and its one scenario, handed to the driver as an ExperimentContext)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from reef_lab.config import ServeConfig
from reef_lab.gateway.gateway import Gateway
from reef_lab.scenarios import ScenarioLimits
from reef_lab.state import is_shared, open_state

log = logging.getLogger("reef_lab.service")


def build_engine(cfg: ServeConfig):
    """The engine the config names (reef_lab.engines: a short name or module:Class), built by its from_config."""
    from reef_lab.engines import engine_class

    return engine_class(cfg.engine_name()).from_config(cfg)


def build_gateway(cfg: ServeConfig, engine=None) -> Gateway:
    Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
    from reef_lab.publishing.hub import HubConfig

    hub = HubConfig(repo=cfg.hub_repo, private=bool(cfg.hub_private)) if cfg.hub_repo else None
    from reef_lab.publishing.tracking import TrackingConfig

    tracking = TrackingConfig(project=cfg.wandb_project, entity=cfg.wandb_entity, group=cfg.wandb_group,
                              mode=cfg.wandb_mode)
    if cfg.upstream_key_from_client and not os.environ.get("REEF_UPSTREAM_API_KEY"):
        log.warning("--upstream-key-from-client without REEF_UPSTREAM_API_KEY: clients' requests carry their own "
                    "keys, but the server's own calls to the provider (GEPA's task and reflection models, the "
                    "change-request proposer) would carry none, so scenarios whose recipe makes them do not learn "
                    "(their error in /reef/status); set REEF_UPSTREAM_API_KEY for those calls")
    state = open_state(cfg.state, cfg.service) if is_shared(cfg.state) else None
    return Gateway(cfg.data_dir, engine if engine is not None else build_engine(cfg), default_recipe=cfg.recipe,
                   default_config=cfg.recipe_settings(), hub=hub, tracking=tracking,
                   allowed_recipes=cfg.allowed_recipe_list(), retention=cfg.retention_config(),
                   roll_records=cfg.roll_records, roll_bytes=cfg.roll_bytes(),
                   harness_allow_executable=bool(cfg.harness_allow_executable),
                   scenario_limits=ScenarioLimits(cfg.max_scenarios, cfg.max_scenarios_per_token), state=state,
                   service=cfg.service, artifacts=cfg.artifacts)


@dataclass(frozen=True)
class ExperimentContext:
    """What an experiment's driver is given by the deployment it runs on: the narrow ways its loop touches its one
    scenario, never the gateway itself (tests/test_layout.py: reef_lab/experiments/ and a recipe's experiment.py
    import no gateway module). The learners' counterpart is reef_lab.learning.recipe.LearnContext."""

    scenario: str
    infer: Callable[..., dict]  # infer(body, tags=None, session=None) -> the stored inference record of a rollout
    report: Callable[..., tuple[bool, str]]  # report(body, tags=None) -> (created, id); handed to the learner
    reported: Callable[[], list[dict]]  # the scenario's stored reports, oldest first (what a resumed run skips)
    learner: Callable[[], Any]  # the scenario's learner, built by its recipe on first call (gateway.learners)
    releases: Callable[[], dict]  # its releases as GET /reef/scenarios/{s}/releases lists them (serving, ...)
    publish_harness: Callable[..., dict]  # publish_harness(files, lineage, scores=...): Releaser.publish_harness
    wait_published: Callable[[float], bool]  # wait_published(timeout): the Hub has every release (True: no Hub)
    close: Callable[[], None]  # stop the deployment (learners, Hub pushes, store); the engine stays the caller's


def open_experiment(data_dir: str | Path, engine, scenario: str, recipe: str, scenario_config: dict | None = None,
                    hub=None, tracking=None) -> ExperimentContext:
    """A gateway over an experiment's data dir on `engine` that offers `recipe`, with the scenario: created with the
    recipe and `scenario_config` unless it exists (a resumed run); with `scenario_config` None, on the basic recipe
    (recorded only: the driver publishes what it finds itself, as GEPA's search does). `hub`: a
    reef_lab.publishing.hub.HubConfig; `tracking`: a reef_lab.publishing.tracking.TrackingConfig (None: off)."""
    gw = Gateway(data_dir, engine, default_recipe="basic", hub=hub, tracking=tracking, allowed_recipes=[recipe])
    if scenario not in {s.name for s in gw.scenarios.list()}:
        body = {"name": scenario} if scenario_config is None else {
            "name": scenario, "recipe": recipe, "config": scenario_config}
        gw.create_scenario(body, operator=True)

    def infer(body: dict, tags: dict[str, str] | None = None, session: str | None = None) -> dict:
        return gw.infer_record(body, scenario, tags, session=session)

    def report(body: dict, tags: dict[str, str] | None = None) -> tuple[bool, str]:
        return gw.report(scenario, body, tags)
    return ExperimentContext(
        scenario=scenario, infer=infer, report=report,
        reported=lambda: gw.store.get_many(gw.store.ids(scenario, "report")),
        learner=partial(gw.learner, scenario), releases=partial(gw.list_releases, scenario),
        publish_harness=partial(gw.releaser.publish_harness, scenario),
        wait_published=gw.hub.wait if gw.hub is not None else lambda timeout: True,
        close=partial(gw.close, close_engine=False))
