"""Optional dependencies, grouped as the package's extras (pyproject.toml), and the one check that names the extra
when a missing one is needed: `need("train")` before torch is imported, and so on.

The core (records, gateway, releases, a relay in front of a provider) needs none of them; `bash scripts/setup.sh`
installs every extra the default tests and the README's server use.
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {  # extra -> (modules it provides, what needs it)
    "train": (("torch", "transformers", "safetensors", "peft", "accelerate", "gguf"),
              "the embedded model and training weights"),
    "tasks": (("reasoning_gym", "datasets"), "the built-in tasks (arithmetic, jsonl, choice) and dataset exports"),
    "hub": (("huggingface_hub",), "publishing releases and records to a Hugging Face Hub"),
    "tracking": (("wandb",), "W&B tracking"),
    "apps": (("marimo", "matplotlib"), "the marimo apps and results plots"),
    "postgres": (("psycopg", "psycopg_pool"), "a shared deployment's state in PostgreSQL (--state postgresql://...)"),
    "tttd": (("scipy",), "TTT-Discover's circle problems (linear programs, the scipy baseline)"),
}


class MissingExtra(ImportError):
    """A feature was used whose extra is not installed; the message names it and the command that installs it."""


def need(extra: str, for_what: str | None = None) -> None:
    """Raise MissingExtra unless every module of `extra` can be imported (checked without importing them)."""
    modules, purpose = EXTRAS[extra]
    missing = [m for m in modules if not _importable(m)]
    if missing:
        raise MissingExtra(f"{for_what or purpose} needs the [{extra}] extra (missing: {', '.join(missing)}): "
                           f"pip install 'reef-lab[{extra}]', or in the repository bash scripts/setup.sh",
                           name=missing[0])


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (a blocked import)
        return False
