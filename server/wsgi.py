"""The WSGI entry point granian loads in its worker process (`server.wsgi:app`).

scripts/serve.py passes the ServeConfig through the REEF_LAB_SERVE_CONFIG environment variable (the path of a
JSON file, or the JSON itself); the worker builds the gateway (loading the model) before it takes traffic, dies
with its parent (so `kill -9` of serve.py never leaves an orphan holding the port), and rolls its record log into
Parquet on a clean exit.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
from pathlib import Path
import time

import orjson

from reef_lab import plugins
from reef_lab.config import ServeConfig, tokens_from_env
from reef_lab.procs import die_with_parent
from reef_lab.service import build_engine, build_gateway
from reef_lab.state import is_shared, open_state
from reef_lab.tenants import follow_shared
from server import tuning, workers
from server.app import create_app
from server.common import legacy_tokens_warning, limits_from
from server.hot import HotRoutes

_held: list = []  # lock files this worker holds for its life (its CPU slot; the primary's lock)
_governor = None  # this worker's tuning.SliceGovernor, when it asks for a short time slice
role = "single"  # or, with several workers, "primary" / "relay" (server/httpd.py restarts all when a primary dies)
_embedded: list = []  # this worker's embedded engine, for stopping()


def stopping() -> None:
    """server/httpd.py calls this when the worker stops (SIGTERM/SIGINT), once it takes no new requests and before
    it waits for those in progress. The embedded engine then ends its generations after the forward pass in
    progress (waiting at most 1.5 s for it): each caller gets a 503 to retry and its error record, so the worker
    exits in seconds rather than after the longest prompt's prefill. Other engines' requests keep the grace."""
    for engine in _embedded:
        started = time.monotonic()
        engine.close(timeout=1.5)
        logging.getLogger("reef_lab.server").info("stopping: the embedded engine closed in %.1f s",
                                                  time.monotonic() - started)


def _closer(gateway):
    def close() -> None:
        started = time.monotonic()
        gateway.close()
        logging.getLogger("reef_lab.server").info("closed the gateway (records, learners, engine) in %.1f s",
                                                  time.monotonic() - started)
    return close


def build_relay(cfg: ServeConfig, tenants):
    """A relay worker (see server/workers.py): inference of known scenarios here, everything else to the
    primary. It checks every token itself, with the same tokens as the primary (read at its start)."""
    limits = limits_from(cfg)
    client = workers.PrimaryClient(cfg.data_dir, tenants, limits)
    client.wait_ready()
    store = None
    if is_shared(cfg.state):  # records straight to the shared database, as the primary's; its tokens followed
        from reef_lab.records.postgres import PgRecordStore
        state = open_state(cfg.state, "relay")
        follow_shared(tenants, state)
        store = PgRecordStore(state)
    gw = workers.RelayGateway(build_engine(cfg), client, cfg.data_dir, cfg.roll_records, cfg.roll_bytes(), store)

    def local(environ, dialect) -> bool:  # reports always (the primary validates them), inference when known
        return dialect is None or environ.get("REQUEST_METHOD") == "POST" and \
            gw.serving(environ.get("HTTP_X_REEF_SCENARIO")) is not None
    logging.getLogger("reef_lab.server").info("relay worker %d ready (primary: the worker holding %s)",
                                              os.getpid(), os.path.join(cfg.data_dir, ".primary.lock"))
    return HotRoutes(client.forward, gw, tenants, local=local, limits=limits)


def build():
    raw = os.environ["REEF_LAB_SERVE_CONFIG"]  # the config as JSON, or the file scripts/serve.py wrote it to
    cfg = ServeConfig(**orjson.loads(raw if raw.lstrip().startswith("{") else Path(raw).read_bytes()))
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    die_with_parent()  # granian's workers; server/httpd.py's come through reef_lab.procs, which does this too
    # This process takes clients' requests: from here on only code its operator named can be imported.
    plugins.restrict_to(cfg.code_paths())
    tenants = cfg.tenants()  # REEF_TOKEN's and the tokens file's, read once: no request reads a file for them
    global _governor, role
    primary = False
    _governor = tuning.apply(cfg, _held)  # before this worker starts any thread: they inherit it
    if cfg.worker_count() > 1:
        lock = workers.claim_or_find_primary(cfg.data_dir)
        if lock is None:
            role = "relay"
            return build_relay(cfg, tenants)
        _held.append(lock)
        primary, role = True, "primary"
    gateway = build_gateway(cfg)
    if gateway.state is not None:  # a shared deployment's tokens (reef-lab token add --state ...) beside ours
        follow_shared(tenants, gateway.state)
    if cfg.engine_name() == "embedded":
        _embedded.append(gateway.engine)
    multiprocessing.util.Finalize(None, _closer(gateway), exitpriority=10)
    if not tenants.enabled:
        logging.getLogger("reef_lab.server").warning(
            "REEF_TOKEN is not set and no --tokens-file names tokens: the API takes requests without a token, from "
            "local programs only (browser pages of other sites are refused). To require a token, start with "
            "REEF_TOKEN=<secret> (or a tokens file: docs/api.md#tokens) and have clients send "
            "'Authorization: Bearer <secret>'")
    legacy = legacy_tokens_warning(tokens_from_env(), tenants)
    if legacy:
        logging.getLogger("reef_lab.server").warning(legacy)
    logging.getLogger("reef_lab.server").info(
        "reef_lab ready on http://%s:%d (engine %s, recipe %s, data %s)", cfg.host, cfg.port,
        gateway.engine.info().get("model") or gateway.engine.model_name, cfg.recipe, cfg.data_dir)
    app = create_app(gateway, tenants, limits_from(cfg))
    if primary:
        workers.PrimaryBridge(app, gateway, cfg.data_dir)
    return app


app = build() if "REEF_LAB_SERVE_CONFIG" in os.environ else None
