"""Tenants: which scenarios a token may use, and what it may do there.

Why: one deployment serves several teams or agents; a token of one must not read, report on, import into, publish
to, roll back or delete another's scenarios, nor add turns to its episodes.

A token has scenarios (exact names, or fnmatch patterns such as `team-a-*`; `*` is every scenario) and a role.
Roles nest, each holding every right of the one before it (admin ⊇ reader ⊇ agent):

- `agent`: inference on its scenarios (a new name it covers creates the scenario), reports on the receipts and
  episodes it made itself, the model list and token counts;
- `reader`: an agent's rights, and reading its scenarios: records, episodes, releases, harness (and its install
  script), change requests;
- `admin`: everything on its scenarios: create, delete, publish a harness, rollback, promote, import records, train,
  change requests, reports on any receipt. An admin of every scenario (`*`) also sees the deployment itself in
  /reef/status (data dir, engine, store); everyone else sees only its own scenarios there.

Tokens come from the operator, never from a client: a YAML file (ServeConfig.tokens_file) lists each token by the
sha256 of its text (the token itself is never stored), and `REEF_TOKEN=t1,t2` adds admin tokens of every scenario.
With no token at all auth is off (loopback use) and every caller is `OPEN`. `reef-lab token add` writes an entry and
prints the new token once. The file is read once at start, in every worker; a change needs a restart.

On each request the presented token is hashed and looked up in a dict (no file read, no loop over tokens); the
scope is an exact-name set and a few compiled patterns. Records carry the token's id (`caller`: the first 16 hex
digits of its sha256), never the token.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from reef_lab.bounded_yaml import read_file  # the bounded YAML reader every operator file goes through
from reef_lab.errors import Forbidden, Unauthorized

ROLES = ("agent", "reader", "admin")  # each holds every right of the roles before it
_RANK = {r: i for i, r in enumerate(ROLES)}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PATTERN = re.compile(r"^[A-Za-z0-9._*?\[\]!-]{1,128}$")  # scenario-name characters plus fnmatch's
ID_LENGTH = 16  # hex digits of the sha256 a record keeps as its caller


def digest(token: str) -> str:
    """The sha256 of a token's text, as the tokens file holds it."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Grant:
    """What one token may do: its role on the scenarios its patterns cover. `id` names it on records (None: auth is
    off, the caller is nobody in particular)."""

    id: str | None
    role: str
    scenarios: tuple[str, ...]
    _exact: frozenset = field(init=False, repr=False, compare=False)
    _patterns: re.Pattern | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in _RANK:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        globs = [p for p in self.scenarios if any(c in p for c in "*?[")]
        object.__setattr__(self, "_exact", frozenset(p for p in self.scenarios if p not in globs))
        object.__setattr__(self, "_patterns", re.compile("|".join(fnmatch.translate(p) for p in globs))
                           if globs else None)

    @property
    def everywhere(self) -> bool:
        """An admin of every scenario: it may also see the deployment itself."""
        return self.role == "admin" and "*" in self.scenarios

    def has(self, role: str) -> bool:
        return _RANK[self.role] >= _RANK[role]

    def covers(self, scenario: str) -> bool:
        return scenario in self._exact or (self._patterns is not None and self._patterns.match(scenario) is not None)

    def check(self, role: str, scenario: str | None = None) -> None:
        """Refuse (403) a route that needs `role`, or a scenario this token does not cover. The answer depends only on
        the token and the name, never on whether the scenario exists, so it tells nothing about other tenants."""
        if not self.has(role):
            raise Forbidden(f"this needs a token with role {role} (or above: agent < reader < admin); this token's "
                            f"role is {self.role}. Ask the operator for a {role} token")
        if scenario is not None and not self.covers(scenario):
            raise Forbidden(f"this token may not use scenario {scenario!r}: it covers {list(self.scenarios)}. Use "
                            "one of those names, or ask the operator for a token of this scenario")

    def may(self, role: str, scenario: str) -> bool:
        return self.has(role) and self.covers(scenario)


OPEN = Grant(None, "admin", ("*",))  # auth off: every request may do everything (loopback use)


class Tenants:
    """The deployment's tokens: sha256 -> Grant. Empty: auth is off."""

    def __init__(self, grants: dict[str, Grant] | None = None):
        self.grants = dict(grants or {})
        self._own = dict(self.grants)  # REEF_TOKEN's and the tokens file's: what set_shared never removes
        _check_ids(self.grants)

    def set_shared(self, grants: dict[str, Grant]) -> None:
        """A shared deployment's tokens (its database's, follow_shared) beside this process's own: replaced whole
        on each change, so a revoked token is refused from the next request on."""
        merged = {**grants, **self._own}
        _check_ids(merged)
        self.grants = merged

    @classmethod
    def load(cls, admin_tokens: list[str] | None = None, tokens_file: str | Path | None = None) -> Tenants:
        """The tokens of the file and of REEF_TOKEN (admin tokens of every scenario)."""
        grants = read_tokens_file(tokens_file) if tokens_file else {}
        for t in admin_tokens or []:
            h = digest(t)
            grants.setdefault(h, Grant(h[:ID_LENGTH], "admin", ("*",)))
        return cls(grants)

    @property
    def enabled(self) -> bool:
        return bool(self.grants)

    def find(self, value: str) -> Grant | None:
        """The grant of a header value (`Bearer <token>` or the token alone), or None."""
        return self.grants.get(digest(value[7:] if value[:7].lower() == "bearer " else value))

    def identify(self, authorization: str, api_key: str) -> Grant:
        """The caller's grant from `Authorization: Bearer <token>` or `x-api-key: <token>` (either one: a client
        bringing its own provider key sends that in the other); 401 when auth is on and neither holds a token."""
        if not self.grants:
            return OPEN
        grant = self.find(authorization) if authorization[:7].lower() == "bearer " else None
        if grant is None and api_key:
            grant = self.find(api_key)
        if grant is None:
            raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <REEF_TOKEN>' "
                               "(or 'x-api-key' for Anthropic clients)")
        return grant


def _check_ids(grants: dict[str, Grant]) -> None:
    ids = [g.id for g in grants.values()]
    if len(set(ids)) != len(ids):
        raise ValueError("two tokens share the first 16 hex digits of their sha256 (their id on records); make "
                         "a new token for one of them")


def read_tokens_file(path: str | Path) -> dict[str, Grant]:
    """sha256 -> Grant from a tokens file (an empty file holds none)."""
    return parse_tokens(read_file(str(path), "tokens_file"), f"tokens_file {path}")


def parse_tokens(data, where: str) -> dict[str, Grant]:
    """sha256 -> Grant from a tokens file's content; ValueError naming the entry and the rule when one does not
    fit."""
    if data is None:
        return {}
    if not isinstance(data, dict) or set(data) != {"tokens"} or not isinstance(data["tokens"], list):
        raise ValueError(f"{where}: must be a mapping with one key, 'tokens': a list of "
                         "{sha256, role, scenarios, name?}")
    grants: dict[str, Grant] = {}
    for i, entry in enumerate(data["tokens"]):
        at = f"{where}: tokens[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be a mapping {{sha256, role, scenarios, name?}}")
        unknown = set(entry) - {"sha256", "role", "scenarios", "name"}
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {sorted(unknown)}; an entry has sha256, role, scenarios, name")
        h, role, scenarios = entry.get("sha256"), entry.get("role"), entry.get("scenarios")
        if not isinstance(h, str) or not _SHA256.match(h):
            raise ValueError(f"{at}: 'sha256' must be the 64 lower-case hex digits of the token's sha256 "
                             "(`reef-lab token hash` prints it); the token itself is never written here")
        if role not in _RANK:
            raise ValueError(f"{at}: 'role' must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(scenarios, list) or not scenarios or \
                not all(isinstance(p, str) and _PATTERN.match(p) for p in scenarios):
            raise ValueError(f"{at}: 'scenarios' must be a non-empty list of scenario names or fnmatch patterns "
                             "(['team-a-*']; ['*'] is every scenario)")
        if entry.get("name") is not None and not isinstance(entry["name"], str):
            raise ValueError(f"{at}: 'name' (the operator's label for the token) must be a string")
        if h in grants:
            raise ValueError(f"{at}: the same token is listed twice; give it one entry")
        grants[h] = Grant(h[:ID_LENGTH], role, tuple(scenarios))
    Tenants(grants)  # ids unique
    return grants


def add_token(path: str | Path, role: str, scenarios: list[str], name: str | None = None) -> tuple[str, str]:
    """Make a new token, add its entry (its sha256, never the token) to the tokens file, and return (token, id).
    The file is checked whole, with the new entry, before it is replaced (atomically)."""
    path = Path(path)
    data = (read_file(str(path), "tokens_file") if path.exists() else None) or {"tokens": []}
    parse_tokens(data, f"tokens_file {path}")
    token, entry = _new_entry(role, scenarios, name)
    data["tokens"].append(entry)
    parse_tokens(data, "the new entry")
    _write_file(path, data)
    return token, entry["sha256"][:ID_LENGTH]


def revoke_token(path: str | Path, token_id: str) -> dict:
    """Take the token whose id (the first 16 hex digits of its sha256, as records and status show it) is
    `token_id` out of the tokens file; its entry. ValueError when no entry has that id."""
    path = Path(path)
    data = (read_file(str(path), "tokens_file") if path.exists() else None) or {"tokens": []}
    parse_tokens(data, f"tokens_file {path}")
    entry = _take(data, token_id, f"tokens_file {path}")
    _write_file(path, data)
    return entry


# ---- a shared deployment's tokens: one document of its database (reef_lab/state/postgres.py) ----------------
SHARED = ("tokens", "deployment")  # (space, key) of the document


def follow_shared(tenants: Tenants, state) -> None:
    """Keep `tenants` on the shared deployment's tokens: read now and again on every change any service makes
    (the database's notice: a token added or revoked holds at every gateway within a second)."""
    def load(_key: str | None = None) -> None:
        body, _ = state.read_doc(*SHARED)
        tenants.set_shared(parse_tokens(body, "the shared deployment's tokens") if body else {})
    load()
    state.on(SHARED[0], load)


def add_shared_token(state, role: str, scenarios: list[str], name: str | None = None) -> tuple[str, str]:
    """`add_token` on the shared deployment's tokens (`reef-lab token add --state postgresql://...`)."""
    body, rev = state.read_doc(*SHARED)
    data = body or {"tokens": []}
    token, entry = _new_entry(role, scenarios, name)
    data["tokens"].append(entry)
    parse_tokens(data, "the new entry")
    state.write_doc(*SHARED, data, rev)
    return token, entry["sha256"][:ID_LENGTH]


def revoke_shared_token(state, token_id: str) -> dict:
    body, rev = state.read_doc(*SHARED)
    data = body or {"tokens": []}
    entry = _take(data, token_id, "the shared deployment's tokens")
    state.write_doc(*SHARED, data, rev)
    return entry


def _new_entry(role: str, scenarios: list[str], name: str | None) -> tuple[str, dict]:
    token = "reef-" + secrets.token_urlsafe(32)
    return token, {"sha256": digest(token), "role": role, "scenarios": list(scenarios),
                   **({"name": name} if name else {})}


def _take(data: dict, token_id: str, where: str) -> dict:
    found = [e for e in data["tokens"] if e["sha256"][:ID_LENGTH] == token_id]
    if not found:
        raise ValueError(f"{where} hold no token with id {token_id!r} (the id is the first {ID_LENGTH} hex digits "
                         "of its sha256, as records and /reef/status show it)")
    data["tokens"].remove(found[0])
    return found[0]


def _write_file(path: Path, data: dict) -> None:
    import yaml

    from reef_lab.files import write_atomic

    header = "# reef_lab tokens (docs/api.md#tokens): each by its sha256; the tokens themselves are never stored\n"
    write_atomic(path, (header + yaml.safe_dump(data, sort_keys=False)).encode())
