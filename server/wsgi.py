"""The WSGI entry point granian loads in its worker process (`server.wsgi:app`).

scripts/serve.py passes the ServeConfig through the REEF_LAB_SERVE_CONFIG environment variable; the worker
builds the gateway (loading the model) before it takes traffic, dies with its parent (so `kill -9` of
serve.py never leaves an orphan holding the port), and rolls its record log into Parquet on a clean exit.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing.util
import os
import signal
import sys

import orjson

from reef_lab.config import ServeConfig, tokens_from_env
from reef_lab.service import build_gateway
from server.app import create_app


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before prctl took effect
            os._exit(1)


def build():
    cfg = ServeConfig(**orjson.loads(os.environ["REEF_LAB_SERVE_CONFIG"]))
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _die_with_parent()
    gateway = build_gateway(cfg)
    multiprocessing.util.Finalize(None, gateway.close, exitpriority=10)
    tokens = tokens_from_env()
    if not tokens:
        logging.getLogger("reef_lab.server").warning(
            "REEF_TOKEN is not set: the API takes requests without a token (fine on loopback)")
    logging.getLogger("reef_lab.server").info(
        "reef_lab ready on http://%s:%d (engine %s, recipe %s, data %s)", cfg.host, cfg.port,
        gateway.engine.info().get("model") or gateway.engine.model_name, cfg.recipe, cfg.data_dir)
    return create_app(gateway, tokens)


app = build() if "REEF_LAB_SERVE_CONFIG" in os.environ else None
