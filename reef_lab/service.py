"""Build a running gateway from a ServeConfig: the engine it names, the store in its data dir."""

from __future__ import annotations

import logging
from pathlib import Path

from reef_lab.config import ServeConfig
from reef_lab.gateway import Gateway

log = logging.getLogger("reef_lab.service")


def build_engine(cfg: ServeConfig):
    if cfg.upstream_url:
        from reef_lab.engines.upstream import UpstreamEngine
        return UpstreamEngine(cfg.upstream_url, cfg.upstream_model, timeout=cfg.upstream_timeout)
    from reef_lab.engines.embedded import EmbeddedEngine, default_cache_dir
    return EmbeddedEngine.from_path(cfg.model_path, cache_dir=default_cache_dir(), max_batch=cfg.max_batch)


def build_gateway(cfg: ServeConfig, engine=None) -> Gateway:
    Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
    from reef_lab.hub import HubConfig

    hub = HubConfig(repo=cfg.hub_repo, private=bool(cfg.hub_private)) if cfg.hub_repo else None
    from reef_lab.tracking import TrackingConfig

    tracking = TrackingConfig(project=cfg.wandb_project, entity=cfg.wandb_entity, group=cfg.wandb_group,
                              mode=cfg.wandb_mode)
    return Gateway(cfg.data_dir, engine if engine is not None else build_engine(cfg), default_recipe=cfg.recipe,
                   default_config=cfg.recipe_settings(), hub=hub, tracking=tracking,
                   allowed_recipes=cfg.allowed_recipe_list())
