"""Old import paths and fields that moved, kept working for one release: each use resolves from the new home with a
DeprecationWarning that names it. Everything here is deleted in 0.3.0 (CHANGELOG.md), with the few lines that call it
(grep `_moved`).

- A module that no longer exists (`reef_lab.learning.samples`): `install()` (run by `import reef_lab`) puts a finder
  last on `sys.meta_path` that answers for MODULES' old paths, and for the modules of an old package, with a stand-in
  module whose names come from the new homes; a name it gives out warns where it is imported.
- A module that became a package of its own name (`reef_lab/tasks.py` is now `reef_lab/tasks/`): the package's
  `__getattr__` calls `old_name`, which gives the old module's names from PACKAGES' home.
- A field that moved: `sample_fields` (the learner calls it on every batch) moves a 0.1 recipe's
  `Sample.extra["advantages"]` to `Sample.advantages`.

Nothing here imports a new home before an old path is used: `import reef_lab` stays light. Only the standard
library is imported, and no module of reef_lab imports an old path (tests/test_sdk.py).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from types import ModuleType

REMOVED_IN = "0.3.0"

# Old module -> its new homes, the first its own (the old path's submodules follow it there: reef_lab.agents.cli is
# reef_lab.harness.install.cli); a later home holds names that moved on again (request_messages to wire.text).
MODULES: dict[str, tuple[str, ...]] = {
    # issue 40 (docs/architecture.md): tasks left learning/, Sample went to the trainers, the dialects to wire/
    "reef_lab.learning.samples": ("reef_lab.trainers.samples",),
    "reef_lab.learning.tasks": ("reef_lab.tasks.base",),
    "reef_lab.learning.tool_tasks": ("reef_lab.tasks.tools",),
    "reef_lab.learning.tool_demos": ("reef_lab.tasks.demos",),
    "reef_lab.learning.bfcl": ("reef_lab.tasks.bfcl",),
    "reef_lab.learning.experiment": ("reef_lab.experiments.weights",),
    "reef_lab.gateway.dialects": ("reef_lab.wire.dialects", "reef_lab.wire.text"),
    "reef_lab.gateway.answers": ("reef_lab.wire.answers",),
    "reef_lab.gateway.accumulate": ("reef_lab.wire.accumulate",),
    "reef_lab.gateway.tools": ("reef_lab.wire.tools",),
    "reef_lab.gateway.responses_tools": ("reef_lab.wire.responses_tools",),
    "reef_lab.gateway.translate": ("reef_lab.wire.translate",),
    "reef_lab.gateway.scenarios": ("reef_lab.scenarios",),
    "reef_lab.agents": ("reef_lab.harness.install",),
    "reef_lab.harness_requests": ("reef_lab.harness.change_requests",),
    "reef_lab.engines.batching": ("reef_lab.engines.embedded.batching",),
    # issue 51: no import cycle between rooms (the records' export reads releases, so it sits with publishing)
    "reef_lab.records.export": ("reef_lab.publishing.export",),
    # issue 19: the first layout's top-level modules went into subpackages
    "reef_lab.recipe": ("reef_lab.learning.recipe",),
    "reef_lab.learner": ("reef_lab.learning.learner",),
    "reef_lab.learner_loop": ("reef_lab.learning.loop",),
    "reef_lab.rl": ("reef_lab.learning.rl", "reef_lab.trainers.losses"),
    "reef_lab.evaluation": ("reef_lab.learning.evaluation",),
    "reef_lab.experiment": ("reef_lab.experiments.weights",),
    "reef_lab.samples": ("reef_lab.trainers.samples",),
    "reef_lab.store": ("reef_lab.records.store", "reef_lab.records.segments", "reef_lab.records.logfile"),
    "reef_lab.record_index": ("reef_lab.records.index",),
    "reef_lab.export": ("reef_lab.publishing.export",),
    "reef_lab.releases": ("reef_lab.publishing.releases",),
    "reef_lab.hub": ("reef_lab.publishing.hub",),
    "reef_lab.tracking": ("reef_lab.publishing.tracking",),
    "reef_lab.lm": ("reef_lab.engines.lm",),
    "reef_lab.dialects": ("reef_lab.wire.dialects", "reef_lab.wire.text", "reef_lab.wire.accumulate"),
}

# A module that became a package of its name -> the home of the old module's names (reef_lab.gateway.Gateway).
PACKAGES: dict[str, str] = {
    "reef_lab.gateway": "reef_lab.gateway.gateway",
    "reef_lab.harness": "reef_lab.harness.tree",
    "reef_lab.records": "reef_lab.records.record",
    "reef_lab.tasks": "reef_lab.tasks.base",
}

_public: frozenset[str] = frozenset()  # reef_lab.__all__: a warning also says `reef_lab.<name>` where there is one


def install(public: list[str]) -> None:
    """Answer for the old module paths from now on (once per process); `public` is the SDK's surface."""
    global _public
    _public = frozenset(public)
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.append(_OldPaths())


def homes(old: str) -> tuple[str, ...] | None:
    """The new homes of an old module path (None: not one); a submodule of an old package follows it."""
    for prefix, new in MODULES.items():
        if old == prefix:
            return new
        if old.startswith(prefix + "."):
            return (new[0] + old[len(prefix):],)
    return None


def _warn(old: str, name: str, home: str, stacklevel: int) -> None:
    """`stacklevel`: 1 is the caller of _warn; the warning points at the line that used the old name."""
    also = f" (or `reef_lab.{name}`)" if name in _public else ""
    warnings.warn(f"{old}.{name} moved: import {name} from {home}{also}; the old path {old} is removed in reef_lab "
                  f"{REMOVED_IN} (CHANGELOG.md)", DeprecationWarning, stacklevel=stacklevel + 1)


class _OldPaths:
    """The meta path finder of the old module paths. Last on sys.meta_path: a real module always wins."""

    def find_spec(self, fullname: str, path=None, target=None) -> ModuleSpec | None:
        new = homes(fullname) if fullname.startswith("reef_lab.") else None
        if new is None:
            return None
        from importlib.util import find_spec

        spec = find_spec(new[0])  # no such module there: the old path has none either (ModuleNotFoundError)
        if spec is None:
            return None
        return ModuleSpec(fullname, _StandIn(new), is_package=spec.submodule_search_locations is not None)


class _StandIn:
    """Loads an old path as a module whose names are its homes' (the first home imported now, so an old path fails
    to import exactly when its new home does); each name warns on use, naming where it lives now."""

    def __init__(self, new: tuple[str, ...]):
        self.new = new

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return ModuleType(spec.name, f"Moved to {self.new[0]} (reef_lab/_moved.py); removed in {REMOVED_IN}.")

    def exec_module(self, module: ModuleType) -> None:
        importlib.import_module(self.new[0])
        old, new = module.__name__, self.new

        def __getattr__(name: str):
            if not name.startswith("_"):
                for home in new:
                    value = getattr(importlib.import_module(home), name, _MISSING)
                    if value is not _MISSING:
                        _warn(old, name, home, stacklevel=2)
                        return value
            raise AttributeError(f"module {old!r} has no attribute {name!r} (it moved to {new[0]})")

        module.__getattr__ = __getattr__


_MISSING = object()


def old_name(package: str, name: str):
    """A name of the module `package` replaced, from its home in PACKAGES with a warning (a package's
    `__getattr__`). AttributeError for a private name, a module, or a submodule of the package not yet imported,
    so `from reef_lab.tasks import tools` still imports the submodule."""
    home = PACKAGES[package]
    if not name.startswith("_"):
        from importlib.util import find_spec

        value = getattr(importlib.import_module(home), name, _MISSING)
        if value is not _MISSING and not isinstance(value, ModuleType) and find_spec(f"{package}.{name}") is None:
            _warn(package, name, home, stacklevel=3)
            return value
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


# module -> {old class name: its name now}: one name means one class (issue 51: ToolCall, Turn and Limits each named
# two or three); the module's `__getattr__` calls `renamed`.
RENAMED: dict[str, dict[str, str]] = {
    "reef_lab.engines.tools": {"ToolCall": "ParsedCall", "Turn": "ParsedTurn"},
}


def renamed(module: str, name: str):
    """The class `module` now names otherwise (RENAMED), with a warning naming it; AttributeError for any other."""
    new = RENAMED.get(module, {}).get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} is now {module}.{new} (one name, one class); the old name is removed in reef_lab "
                  f"{REMOVED_IN} (CHANGELOG.md)", DeprecationWarning, stacklevel=3)
    return getattr(sys.modules[module], new)


def sample_fields(samples: list) -> None:
    """A 0.1 recipe put a sample's per-token advantages in `extra["advantages"]`; they are `Sample.advantages` now
    (the losses read them there). Moves them, with a warning, where a recipe's build_batch left them in extra."""
    moved = [s for s in samples if s.advantages is None and "advantages" in s.extra]
    for s in moved:
        s.advantages = s.extra.pop("advantages")
    if moved:
        warnings.warn("Sample.extra['advantages'] moved: set Sample.advantages (reef_lab.trainers.samples.Sample); "
                      f"the old key is read until reef_lab {REMOVED_IN} (CHANGELOG.md)", DeprecationWarning,
                      stacklevel=2)
