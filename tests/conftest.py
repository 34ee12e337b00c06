"""Shared fixtures: a stub provider and reef_lab servers on loopback (real HTTP, real SDK clients)."""

from __future__ import annotations

import os
import threading

import pytest
from werkzeug.serving import make_server

from reef_lab.engines.embedded import default_cache_dir
from reef_lab.engines.tiny import build_tiny_model, smollm2_tokenizer
from reef_lab.engines.upstream import UpstreamEngine
from reef_lab.gateway.gateway import Gateway
from reef_lab.testing.stub_provider import serve_in_thread
from server.app import create_app

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class Running:
    def __init__(self, gateway: Gateway, tokens=None):
        self.gateway = gateway
        self.server = make_server("127.0.0.1", 0, create_app(gateway, tokens), threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        # a short poll: shutdown() waits up to one poll interval (werkzeug's default 0.5 s, once per test)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

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


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer: from the converted cache when it is there (fast), else from the GGUF (~7 s)."""
    return smollm2_tokenizer(default_cache_dir())


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
    """A ~6M-parameter Llama (reef_lab/engines/tiny.py: what `--model-path tiny` serves)."""
    return build_tiny_model(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model, tokenizer, tmp_path_factory):
    """The tiny Llama saved as a Hugging Face folder (what trainers and `EmbeddedEngine.from_path` load)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tool_model(tiny_model, tokenizer):
    """The tiny Llama taught the tool-calling script of tests/tool_model.py (a few dozen steps, once a session)."""
    from tests.tool_model import train_tool_model

    return train_tool_model(tiny_model, tokenizer)


@pytest.fixture(scope="session")
def tool_model_dir(tool_model, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tool-llama")
    tool_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
