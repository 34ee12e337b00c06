"""Optional dependencies are extras (pyproject.toml): the core serves a relay without any of them, and a feature
whose extra is missing says which extra to install (reef_lab/extras.py need)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from reef_lab.extras import EXTRAS, MissingExtra, need

OPTIONAL = sorted({m for modules, _ in EXTRAS.values() for m in modules})


def test_a_missing_extra_is_named_with_the_command_that_installs_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy", None)  # as if scipy were not installed
    with pytest.raises(MissingExtra) as e:
        need("tttd")
    assert "[tttd] extra" in str(e.value) and "pip install 'reef-lab[tttd]'" in str(e.value)
    assert "missing: scipy" in str(e.value)
    need("train")  # installed here: no error


def test_a_feature_whose_extra_is_missing_says_so(monkeypatch):
    from recipes.tttd.problems import CircleCentres

    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(MissingExtra, match=r"\[tttd\] extra"):
        CircleCentres(3).verify("```python\n[(0.25, 0.25), (0.75, 0.25), (0.5, 0.75)]\n```")


BLOCKER = f"""
import importlib.abc, sys
BLOCKED = {OPTIONAL!r}
class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None
sys.meta_path.insert(0, Blocker())
"""


def run_without_extras(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def test_the_core_serves_a_relay_without_any_extra(tmp_path, stub_url):
    out = run_without_extras(f"""
        import json, urllib.request
        from werkzeug.serving import make_server
        import threading
        from reef_lab.config import parse_serve_config
        from reef_lab.service import build_gateway
        from server.app import create_app
        cfg = parse_serve_config(["--upstream-url", {stub_url!r}, "--data-dir", {str(tmp_path / "data")!r}])
        gw = build_gateway(cfg)
        srv = make_server("127.0.0.1", 0, create_app(gw), threaded=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        req = urllib.request.Request(f"http://127.0.0.1:{{srv.server_port}}/v1/chat/completions", method="POST",
            data=json.dumps({{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}).encode(),
            headers={{"Content-Type": "application/json", "x-reef-scenario": "core"}})
        with urllib.request.urlopen(req, timeout=30) as r:
            body, receipt = json.loads(r.read()), r.headers["x-reef-agent-record-id"]
        srv.shutdown()
        gw.close()
        loaded = sorted(m for m in {OPTIONAL!r} if m in sys.modules)
        print(json.dumps({{"text": body["choices"][0]["message"]["content"], "receipt": receipt, "loaded": loaded}}))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    result = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    assert result["text"] == "echo: hi" and result["receipt"].startswith("rec_") and result["loaded"] == []


def test_the_embedded_server_without_the_train_extra_names_it():
    out = run_without_extras("""
        from reef_lab.config import parse_serve_config
        parse_serve_config([])
    """)
    assert out.returncode == 2 and "needs the [train] extra" in out.stderr, out.stderr[-3000:]
