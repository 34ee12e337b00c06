"""Atomic file writes: the one way state files (scenarios, release indexes, learner state) are replaced, so a crash
leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
from pathlib import Path

import orjson


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` beside `path`, fsync it, and rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path: str | Path, obj, indent: bool = False) -> None:
    """`obj` as JSON (orjson; `indent`: two spaces, for files people read), written atomically."""
    write_atomic(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0, default=str))


class JsonDoc:
    """A JSON document kept in one file (a learner's ledger on one machine); a shared deployment gives its
    learners reef_lab.state.postgres.SharedDoc instead, the same two methods on the database."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def read(self) -> dict | None:
        return orjson.loads(self.path.read_bytes()) if self.path.exists() else None

    def write(self, body: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, body)
