"""`scripts/serve.py --engine vllm` killed under traffic leaves no process of the vLLM server behind (issue 28): the
tree below serve.py (its worker, the vLLM API server, EngineCore and its workers) is recorded from /proc before the
kill, and within 5 s of the final SIGKILL none of it is left. Two ways a server gets killed: `kill -9` of serve.py
alone, and a supervisor's SIGTERM to serve.py's process group followed 15 s later by SIGKILL to it (while long
streamed answers keep the worker from finishing in time)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reef_lab import procs
from reef_lab.engines.embedded import DEFAULT_MODEL_NAME, default_cache_dir
from reef_lab.testing import free_port
from reef_lab.testing.vllm_scoring import vllm_model
from tests.test_procs import alive, gone_within, start_time

pytestmark = [pytest.mark.heavy, pytest.mark.vllm]
ROOT = Path(__file__).resolve().parents[1]
MODEL = default_cache_dir() / DEFAULT_MODEL_NAME


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ask(port: int, max_tokens: int, stop: threading.Event, answered: list) -> None:
    """Streamed chat completions, one after another, until `stop` or the server goes away."""
    body = json.dumps({"model": "m", "max_tokens": max_tokens, "stream": True, "temperature": 1.0,
                       "messages": [{"role": "user", "content": "Tell me a long story about the sea."}]})
    while not stop.is_set():
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json",
                                                              "x-reef-scenario": "procs"})
            r = c.getresponse()
            r.read()
            answered.append(r.status)
        except (OSError, http.client.HTTPException):
            return


@pytest.mark.parametrize("how", ["kill-9", "sigterm-group-then-sigkill-15s"])
def test_no_process_of_the_vllm_server_outlives_serve_py(tmp_path, how):
    if vllm_model() is None:
        pytest.skip("vLLM is not installed: bash scripts/setup.sh --vllm")
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    serve = subprocess.Popen([sys.executable, "scripts/serve.py", "--engine", "vllm", "--port", str(port),
                              "--data-dir", str(tmp_path / "data"), "--engine-options", f"{{port: {free_port()}}}",
                              "--log-level", "warning"], cwd=ROOT, start_new_session=True, stdout=log,
                             stderr=subprocess.STDOUT)
    stop, answered, tree = threading.Event(), [], {}
    try:
        deadline = time.monotonic() + 900
        while True:  # ready once it answers
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "serve.py --engine vllm did not answer within 15 min"
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                c.request("POST", "/v1/chat/completions", json.dumps({"model": "m", "max_tokens": 4, "messages": [
                    {"role": "user", "content": "hi"}]}), {"Content-Type": "application/json",
                                                           "x-reef-scenario": "procs"})
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(2)
        max_tokens = 48 if how == "kill-9" else 1500  # long answers: the worker cannot finish them within 15 s
        clients = [threading.Thread(target=ask, args=(port, max_tokens, stop, answered)) for _ in range(4)]
        [t.start() for t in clients]
        time.sleep(8)  # traffic under way: answers in flight in vLLM
        tree = {pid: (pid, start_time(pid)) for pid, state in procs.below(serve.pid) if state not in ("Z", "X")}
        names = {pid: cmdline(pid) for pid in tree}
        api = [pid for pid, line in names.items() if "vllm.entrypoints.openai.api_server" in line
               and "reef_lab/procs.py" not in line]
        assert len(api) == 1, names
        below_api = procs.below(api[0])
        assert below_api, f"vLLM's API server started no EngineCore: {names}"  # the grandchildren are in the tree
        if how == "kill-9":
            serve.kill()
        else:
            os.killpg(serve.pid, signal.SIGTERM)
            time.sleep(15)
            os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()
        left = gone_within(tree, 5)
        assert left == [], {pid: names[pid] for pid in left}
    finally:
        stop.set()
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
        for pid in alive(tree):
            os.kill(pid, signal.SIGKILL)
        log.close()
