"""The Recipe protocol: how a scenario turns reported traffic into an improvement.

This file holds the part serving needs today (a recipe checks the reports it is given against its own schema);
training hooks (readiness, batches, candidates, judging) join it with the trainers. A deployment names its recipe
by a `module:Class` path, or by a bare name `x` meaning `recipes.x:Recipe`.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from reef_lab.errors import BadRequest


class Recipe(Protocol):
    name: str

    def validate_report(self, report: dict) -> None:
        """Raise BadRequest naming the problem when a report does not fit this recipe's schema."""


def recipe_path(spec: str) -> str:
    return spec if ":" in spec else f"recipes.{spec}:Recipe"


def load_recipe(spec: str, config: dict | None = None) -> Recipe:
    path = recipe_path(spec)
    module, _, cls = path.partition(":")
    try:
        klass = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise BadRequest(f"recipe {spec!r} cannot be loaded from {path!r} ({e}); name one of the folders in "
                         "recipes/ or give a module:Class path") from e
    return klass(**(config or {}))
