"""Test doubles (what cannot run here, or must answer predictably: a provider, the Hub, SGLang's API, a fuzzer) and
loopback utilities, for the tests and the scripts that measure (scripts/soak.py, scripts/bench_gateway.py, ...);
not part of the reef_lab package."""

import socket


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
