"""Episodes: which agent session a call belongs to, and an episode's records read back in turn order.

An agent run is many calls; reef_lab groups them by a session id the client already sends, so agents work
unchanged. The first of these that a request carries names its episode:

1. `x-reef-session` (any client may set it; refused with a 400 when it is not 1-128 of [A-Za-z0-9_.:-]);
2. `x-claude-code-session-id` (Claude Code 2.1.197 sends it on every call);
3. `session-id` (Codex CLI 0.171.0; its Responses body's `prompt_cache_key` holds the same id);
4. `x-session-id` (opencode 1.18.33);
5. the `session_id` inside an Anthropic body's `metadata.user_id` (Claude Code sends it there too, as JSON text;
   older versions as `user_<hash>_account_<uuid>_session_<uuid>`). A `user_id` with no session in it names a
   user, not a session, and is not used.

Measured against the real CLIs by tests/test_agents.py (marker `agents`). A client's own id that reef_lab's id
rules do not allow is kept as a hash of it (`sha-` + 32 hex), so any client's session still groups.

An episode belongs to its scenario and to the token that made its calls (the records' `caller`,
reef_lab/tenants.py): another token that sends the same session id starts an episode of its own, and cannot add turns
to this one, nor report on it.

Turns are numbered when an episode is read, not when a call is recorded: the calls of one session may be served by
several workers (each writes its own log), and no counter is shared among them. Turn n is the n-th of the episode's
inference records ordered by (created_at, id): the time each call was recorded, the record id breaking a tie. For an
agent's loop, where a call is made only after the previous answer arrived, that is the order of its calls
(docs/decisions.md, "Episode turns are numbered on read").
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson

from reef_lab.errors import BadRequest, NotFound
from reef_lab.records.record import ID_RE

SESSION_HEADER = "x-reef-session"
EPISODE_HEADER = "x-reef-episode"  # on every answer that belongs to an episode
CLIENT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-id")
_LEGACY_USER_ID = re.compile(r"_session_([0-9A-Za-z-]{8,})$")


def check_episode_id(value: Any, what: str = "episode id") -> str:
    if not isinstance(value, str) or not ID_RE.match(value):
        shown = repr(value)[:60] if isinstance(value, str) else f"a {type(value).__name__}"
        raise BadRequest(f"{what} {shown} is invalid: use 1-128 letters, digits, '_', '.', ':' or '-'")
    return value


def _kept(client_id: str) -> str:
    """A client's own session id as an episode id: as is when it fits the id rules, else a hash of it."""
    if ID_RE.match(client_id):
        return client_id
    return "sha-" + hashlib.blake2b(client_id.encode(), digest_size=16).hexdigest()


def _from_user_id(body: dict) -> str | None:
    meta = body.get("metadata")
    user_id = meta.get("user_id") if isinstance(meta, dict) else None
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        sid = parsed.get("session_id") if isinstance(parsed, dict) else None
        return sid if isinstance(sid, str) and sid else None
    m = _LEGACY_USER_ID.search(user_id)
    return m.group(1) if m else None


def detect(headers: dict[str, str] | None, body: Any) -> str | None:
    """The episode a request belongs to (None: none), from its lower-cased headers and its body."""
    headers = headers or {}
    explicit = headers.get(SESSION_HEADER)
    if explicit is not None:
        return check_episode_id(explicit, f"the {SESSION_HEADER} header")
    for name in CLIENT_SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return _kept(value)
    if isinstance(body, dict):
        sid = _from_user_id(body)
        if sid:
            return _kept(sid)
    return None


def episode_ids(store, scenario: str, episode: str, since: float = 0.0, caller: str | None = None) -> list[str]:
    """The ids of an episode's inference records in turn order ((created_at, id); see the module docstring): the
    calls `caller` (a token's id; None: auth off) made with that session id, wherever they were stored (the store
    answers: a scan of the data dir's records, or a query of the shared database)."""
    return store.episode(scenario, episode, caller, since)


def numbered(records: list[dict]) -> list[dict]:
    """An episode's records (already in turn order) with their turn, 1-based."""
    return [{**r, "turn": i} for i, r in enumerate(records, start=1)]


def episode_references(store, scenarios, name: str, episode, refs, caller: str | None = None) -> list[str]:
    """A report's `episode` (the reporting token's own), resolved to the receipts of its calls now (in turn
    order)."""
    check_episode_id(episode, "'episode'")
    if refs is not None:
        raise BadRequest("give a report either 'references' (receipts) or 'episode' (all its calls), not both")
    s = scenarios.get(name)
    ids = episode_ids(store, name, episode, s.since, caller)
    if not ids:
        raise BadRequest(f"episode {episode!r} has no calls in scenario {name!r}" + _by_token(caller))
    return ids


def read_episode(store, scenarios, scenario: str, episode: str, caller: str | None = None) -> dict:
    """GET /reef/episodes/<id>: the calls `caller`'s token made in the episode, in turn order, each with its `turn`
    (1-based)."""
    s = scenarios.get(scenario)
    check_episode_id(episode)
    ids = episode_ids(store, s.name, episode, s.since, caller)
    if not ids:
        raise NotFound(f"episode {episode!r} has no calls in scenario {s.name!r}" + _by_token(caller))
    records = numbered(store.get_many(ids))
    return {"scenario": s.name, "episode": episode, "caller": caller, "turns": len(records), "records": records}


def _by_token(caller: str | None) -> str:
    return "" if caller is None else f" made with token {caller} (an episode is its token's own)"
