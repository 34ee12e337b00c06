"""Build a running gateway from a ServeConfig: the engine it names, the store in its data dir."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from reef_lab.config import ServeConfig
from reef_lab.gateway.gateway import Gateway

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
    return Gateway(cfg.data_dir, engine if engine is not None else build_engine(cfg), default_recipe=cfg.recipe,
                   default_config=cfg.recipe_settings(), hub=hub, tracking=tracking,
                   allowed_recipes=cfg.allowed_recipe_list(), retention=cfg.retention_config(),
                   roll_records=cfg.roll_records, roll_bytes=cfg.roll_bytes(),
                   harness_allow_executable=bool(cfg.harness_allow_executable))
