"""Shared fixtures: a stub provider and reef_lab servers on loopback (real HTTP, real SDK clients)."""

from __future__ import annotations

import os
import threading

import pytest
from werkzeug.serving import make_server

from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.gateway import Gateway
from reef_lab.testing.stub_provider import serve_in_thread
from server.app import create_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Running:
    def __init__(self, gateway: Gateway, tokens=None):
        self.gateway = gateway
        self.server = make_server("127.0.0.1", 0, create_app(gateway, tokens), threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.gateway.close()


@pytest.fixture(scope="session")
def stub_url():
    srv, url = serve_in_thread()
    yield url
    srv.shutdown()


@pytest.fixture
def serve(tmp_path):
    """serve(engine, tokens=None) -> Running: a gateway over tmp_path behind the Flask app on loopback."""
    running = []

    def start(engine, tokens=None, data_dir=None, recipe="basic"):
        r = Running(Gateway(data_dir or tmp_path / "data", engine, default_recipe=recipe), tokens)
        running.append(r)
        return r
    yield start
    for r in running:
        r.stop()


@pytest.fixture
def proxy(serve, stub_url):
    """A reef_lab server relaying to the stub provider."""
    return serve(UpstreamEngine(stub_url, timeout=2.0))
