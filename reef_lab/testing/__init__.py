"""Test doubles and loopback utilities: what cannot run here, or must answer predictably (a provider, the Hub,
SGLang's and vLLM's APIs, a fuzzer, real agent clients), for reef_lab's tests, the benchmarks and studies in
scripts/, and a plug-in author testing a recipe or an engine against the same doubles (as torch.testing).

Each module is imported on its own (`from reef_lab.testing.stub_provider import serve_in_thread`); this one holds
only `free_port`, `wait_http` and where the checkout is, so `import reef_lab.testing` pulls in nothing heavy (no torch, no server). Nothing
here imports server/, scripts/, recipes/ or tests/; `processes.start_server` runs the repository's scripts/serve.py
as a child process, by path.
"""

import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout reef_lab is installed from (bash scripts/setup.sh: editable)


def serve_script() -> Path:
    """The repository's scripts/serve.py, which the helpers that start a live server run as a child process, by path
    (nothing here imports scripts/). Raises where reef_lab is not installed editable from its checkout."""
    path = ROOT / "scripts" / "serve.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: a live server is started from the repository's scripts/serve.py, "
                                "so install reef_lab editable from its checkout (bash scripts/setup.sh)")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_http(url: str, timeout: float = 120) -> None:
    """Block until `url` answers any HTTP response (a server started as a child process is up)."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")
