"""What serves each scenario besides the engine's own routing: its harness release (id and files) and, for a
composite release, the names and versions of its components.

Kept in memory by the one owner of releases (reef_lab.publishing.releaser) and read on every inference
(reef_lab.gateway.inference), so a request never reads the release index from disk.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

from reef_lab.harness import Harness


@dataclass(frozen=True)
class Serving:
    release_id: str | None  # the release named on records and headers (None: the engine's routing names it)
    harness: tuple[str, Harness] | None = None  # (harness release id, its tree parsed once) applied to each request
    components: dict[str, str] | None = None  # composite releases: component name -> its version's release id


class ServingTable:
    """scenario -> Serving; `on_change` runs after every change (relay workers re-read what serves)."""

    def __init__(self, on_change: Callable[[], None] | None = None):
        self._items: dict[str, Serving] = {}
        self._lock = threading.Lock()
        self.on_change = on_change

    def get(self, scenario: str) -> Serving | None:
        return self._items.get(scenario)

    def set(self, scenario: str, serving: Serving | None) -> None:
        with self._lock:
            if serving is None:
                self._items.pop(scenario, None)
            else:
                self._items[scenario] = serving
        if self.on_change is not None:
            self.on_change()

    def __contains__(self, scenario: str) -> bool:
        return scenario in self._items
