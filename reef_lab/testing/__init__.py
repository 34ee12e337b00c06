"""Helpers for tests and benchmarks: a stub provider (stub_provider.py) and loopback utilities."""

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
