"""Helpers for tests and benchmarks: a stub provider (stub_provider.py) and loopback utilities."""

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
