"""Scenarios: named streams of traffic, each with its own recipe.

A scenario is created on first use (the `x-reef-scenario` header names it) with the deployment's recipe, or
explicitly with `POST /reef/scenarios`. Each scenario is one JSON file, `<data dir>/scenarios/<name>.scenario.json`,
replaced atomically when it changes: one tenant's change never rewrites another's (issue 50: one `scenarios.json`
holding every tenant's config was rewritten whole on every change, 189-281 ms with 72 MB of configs). A data dir of
an earlier version (one `scenarios.json`) is split into these files when a registry opens it; `stored_scenarios`
reads either layout without writing.
Deleting a scenario hides its records (they stay on disk: records are append-only) and retires its releases and
learner state (reef_lab/gateway/admin.py); a scenario created again under the same name starts empty.

A name is a folder name (releases, learner state) and part of a Hub repo id (`--hub-repo me/reef-{scenario}`), so a
new scenario's name keeps to the rules of both (`check_name(name, new=True)`); a name that only needs looking up is
held to the older, wider rule, so scenarios of data dirs made before keep working.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from reef_lab.errors import BadRequest, Conflict, NotFound, ReefError
from reef_lab.files import write_json

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # any name that can be looked up
NEW_NAME_MAX = 64  # a Hub repo name holds at most 96 characters: 32 are left to the --hub-repo template's own text
NEW_NAME_RULE = (f"a new scenario's name is 1-{NEW_NAME_MAX} letters, digits, '.', '_' or '-', starts and ends with a "
                 "letter or digit, holds no '..' or '--' and does not end in '.git' (it names folders and the Hub "
                 "repo of its releases)")


@dataclass
class Scenario:
    name: str
    recipe: str
    created_at: float = field(default_factory=time.time)
    config: dict = field(default_factory=dict)
    # Who chose `config`: "operator" (the deployment's --recipe-config, an in-process experiment) or "client" (the
    # body of POST /reef/scenarios). A client's config is checked again whenever it is read back (never code,
    # never an operator-only field); scenarios.json of older versions has no origin: a config other than the
    # operator's current one counts as a client's.
    origin: str = "client"
    # The id of the token that created it, when that token is scoped to some scenarios only (it counts against the
    # token's --max-scenarios-per-token); None: the operator, auth off, or an admin of every scenario.
    creator: str | None = None

    @property
    def since(self) -> float:
        """The write time from which records belong to this scenario: a deleted earlier scenario of the same name
        keeps its records on disk (append-only), and they stay out of this one's reads, counts and references."""
        return self.created_at - 1e-6

    def owns(self, entry) -> bool:
        """Whether a record's index entry (scenario, stored_at) is one of this scenario's records."""
        return entry is not None and entry.scenario == self.name and entry.stored_at >= self.since


def check_name(name: object, new: bool = False) -> str:
    """The name, or BadRequest naming the rule it breaks. `new`: the name of a scenario about to be created, held
    to the rules of the folders and the Hub repo id it will name (huggingface_hub's validate_repo_id: `..`, `--`, a
    leading or trailing `.` or `-` and names over 96 characters are refused there, after a release was made)."""
    if name is not None and not isinstance(name, str):
        raise BadRequest(f"the scenario name must be a string, got {type(name).__name__}")
    if not name:
        raise BadRequest("the x-reef-scenario header is required: name the scenario this traffic belongs to")
    if not NAME_RE.match(name):
        raise BadRequest(f"scenario name {name[:140]!r} is invalid: use 1-128 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    if new:
        broken = "is longer than 64 characters" if len(name) > NEW_NAME_MAX else \
            "holds '..'" if ".." in name else "holds '--'" if "--" in name else \
            "ends with '.', '_' or '-'" if not name[-1].isalnum() else \
            "ends in '.git'" if name.lower().endswith(".git") else None
        if broken:
            raise BadRequest(f"scenario name {name!r} {broken}: {NEW_NAME_RULE}")
    return name


LEGACY_FILE = "scenarios.json"  # every scenario in one file: data dirs of earlier versions
FOLDER, SUFFIX = "scenarios", ".scenario.json"


def stored_scenarios(data_dir: str | Path) -> list[dict] | None:
    """The scenarios a data dir holds, as stored (oldest first), from either layout, writing nothing (apps, export);
    None when it holds no registry at all."""
    data_dir = Path(data_dir)
    folder, legacy = data_dir / FOLDER, data_dir / LEGACY_FILE
    if not folder.is_dir() and not legacy.is_file():
        return None
    found = {d["name"]: d for d in orjson.loads(legacy.read_bytes())} if legacy.is_file() else {}
    if folder.is_dir():
        for p in folder.glob(f"*{SUFFIX}"):
            d = orjson.loads(p.read_bytes())
            found[d["name"]] = d
    return sorted(found.values(), key=lambda d: d.get("created_at") or 0)


def shared_scenarios(state) -> list[dict]:
    """The scenarios of a shared deployment's database, as stored (oldest first), writing nothing."""
    with state.connection() as conn:
        return [d for (d,) in conn.execute("SELECT body FROM scenarios ORDER BY changed_at")]


@dataclass(frozen=True)
class ScenarioLimits:
    """How many scenarios the deployment, and each token of some scenarios only, may create (issue 50: an agent
    token created a scenario per name it sent, 600 in 39 s). The operator's (--max-scenarios,
    --max-scenarios-per-token); 0: no limit."""

    total: int = 1000
    per_token: int = 100


class QuotaExceeded(ReefError):
    """A scenario the limits leave no room for: 403 (a permanent refusal; the SDKs retry a 429)."""

    status, type = 403, "permission_error"


class ScenarioRegistry:
    """Every scenario of the deployment, in memory, kept in the data dir's files or (`state`: a shared deployment's
    PostgreSQL, reef_lab/state/postgres.py) in the `scenarios` table. With a shared state, a scenario another
    gateway creates or deletes arrives by the database's change notice (within a second); two gateways creating
    one name at once make one scenario (the database's primary key decides)."""

    def __init__(self, data_dir: str | Path, default_recipe: str, default_config: dict | None = None,
                 limits: ScenarioLimits | None = None, state=None):
        self.folder = Path(data_dir) / FOLDER
        self.default_recipe = default_recipe
        self.default_config = default_config or {}
        self.limits = limits or ScenarioLimits()
        self._lock = threading.Lock()
        self._items: dict[str, Scenario] = {}
        self.on_change = None  # called after every saved change (and, shared, after another service's)
        self._state = state
        if state is not None:
            self._reload(None)
            state.on("scenario", self._heard)
            return
        legacy = Path(data_dir) / LEGACY_FILE
        for d in stored_scenarios(data_dir) or []:
            self._items[d["name"]] = self._scenario(d)
        if legacy.is_file():  # an earlier version's one file: split, then kept aside (never read again)
            for s in self._items.values():
                self._write(s)
            legacy.replace(legacy.with_name(LEGACY_FILE + ".migrated"))

    def _scenario(self, d: dict) -> Scenario:
        if "origin" not in d:
            d["origin"] = "operator" if d.get("config") == self.default_config else "client"
        return Scenario(**d)

    # ---- a shared deployment's table ---------------------------------------------------------------------------
    def _reload(self, name: str | None) -> None:
        """Read one scenario (or, None, all of them) from the shared table again."""
        with self._state.connection() as conn:
            if name is None:
                rows = conn.execute("SELECT body FROM scenarios ORDER BY changed_at").fetchall()
            else:
                rows = conn.execute("SELECT body FROM scenarios WHERE name = %s", (name,)).fetchall()
        found = {d["name"]: self._scenario(d) for (d,) in rows}
        with self._lock:
            if name is None:
                self._items = found
            elif name in found:
                self._items[name] = found[name]
            else:
                self._items.pop(name, None)

    def _heard(self, name: str | None) -> None:
        self._reload(name or None)
        self._saved()

    def _insert(self, made: list[Scenario]) -> list[Scenario]:
        """Lock held: store new scenarios (all in one transaction when shared); what each name holds afterwards
        (another gateway's scenario where it made that name first)."""
        if self._state is None:
            for s in made:
                self._write(s)
            return made
        out = []
        with self._state.tx() as conn:
            for s in made:
                row = conn.execute("INSERT INTO scenarios (name, body, changed_at) VALUES (%s, %s, %s) ON CONFLICT "
                                   "(name) DO NOTHING RETURNING name", (s.name, _jsonb(asdict(s)), time.time())
                                   ).fetchone()
                if row is None:
                    (d,) = conn.execute("SELECT body FROM scenarios WHERE name = %s", (s.name,)).fetchone()
                    out.append(self._scenario(d))
                else:
                    self._state.notify(conn, "scenario", s.name)
                    out.append(s)
        return out

    def _remove(self, name: str) -> None:
        if self._state is None:
            self._file(name).unlink(missing_ok=True)
            return
        with self._state.tx() as conn:
            conn.execute("DELETE FROM scenarios WHERE name = %s", (name,))
            self._state.notify(conn, "scenario", name)

    def _room(self, creator: str | None, extra: int = 0) -> None:
        """Lock held: QuotaExceeded when one more scenario (by `creator`) would pass a limit, with `extra` more
        about to be made before it."""
        total, per_token = self.limits.total, self.limits.per_token
        if total and len(self._items) + extra >= total:
            raise QuotaExceeded(f"this deployment holds {len(self._items)} scenarios, the most it takes "
                                f"(--max-scenarios {total}): delete one (DELETE /reef/scenarios/<name>) or ask the "
                                "operator to raise the limit")
        if creator is not None and per_token:
            made = sum(1 for s in self._items.values() if s.creator == creator) + extra
            if made >= per_token:
                raise QuotaExceeded(f"this token has created {made} scenarios, the most one token of some scenarios "
                                    f"may (--max-scenarios-per-token {per_token}): use an existing scenario, delete "
                                    "one, or ask the operator to raise the limit")

    def _file(self, name: str) -> Path:
        return self.folder / f"{name}{SUFFIX}"

    def _write(self, s: Scenario) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self._file(s.name), asdict(s), indent=True)

    def _saved(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def get(self, name: str) -> Scenario:
        s = self._items.get(name)
        if s is None:
            raise NotFound(f"scenario {name!r} does not exist")
        return s

    def ensure(self, name: str, creator: str | None = None) -> Scenario:
        """The scenario, created with the deployment's recipe if it is new (by `creator`: see Scenario.creator)."""
        s = self._items.get(name)
        if s is not None:
            return s
        with self._lock:
            if name not in self._items:
                check_name(name, new=True)
                self._room(creator)
                s = Scenario(name, self.default_recipe, config=dict(self.default_config), origin="operator",
                             creator=creator)
                self._items[name] = self._insert([s])[0]
                self._saved()
            return self._items[name]

    def create(self, name: str, recipe: str | None = None, config: dict | None = None,
               origin: str = "client", creator: str | None = None) -> Scenario:
        """A new scenario; `origin` says who chose `config` (the deployment's own config when none is given),
        `creator` which scoped token made it (Scenario.creator)."""
        check_name(name, new=True)
        with self._lock:
            if name in self._items:
                raise Conflict(f"scenario {name!r} already exists")
            self._room(creator)
            if config is None and not recipe:
                config, origin = dict(self.default_config), "operator"
            s = Scenario(name, recipe or self.default_recipe, config=config or {}, origin=origin, creator=creator)
            if self._insert([s])[0] is not s:  # another gateway of the deployment made it a moment ago
                raise Conflict(f"scenario {name!r} already exists")
            self._items[name] = s
        self._saved()
        return s

    def delete(self, name: str) -> Scenario:
        with self._lock:
            s = self._items.get(name)
            if s is None:
                raise NotFound(f"scenario {name!r} does not exist")
            self._remove(name)
            self._items.pop(name, None)
        self._saved()
        return s

    def exists(self, name: str) -> bool:
        return name in self._items

    def find(self, name: str) -> Scenario | None:
        """The scenario, or None when it does not exist (nothing is created)."""
        return self._items.get(name)

    def ensure_all(self, names: list[str], creator: str | None = None) -> None:
        """Every named scenario exists after this, the new ones created at once: all or none, within the limits."""
        with self._lock:
            new = list(dict.fromkeys(n for n in names if n not in self._items))
            for n in new:
                check_name(n, new=True)
            for k in range(len(new)):  # room for all of them, counted as if the ones before were made
                self._room(creator, extra=k)
            made = [Scenario(n, self.default_recipe, config=dict(self.default_config), origin="operator",
                             creator=creator) for n in new]
            for s in self._insert(made):
                self._items[s.name] = s
        if new:
            self._saved()

    def list(self) -> list[Scenario]:
        return list(self._items.values())


def _jsonb(value: dict):
    from psycopg.types.json import Jsonb  # only a shared deployment gets here (psycopg is its extra)
    return Jsonb(value)
