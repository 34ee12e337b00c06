"""The shared database of a deployment that outgrows one machine: PostgreSQL through psycopg 3.

What every service of a deployment (gateways, learners) shares lives in tables here; what a service keeps in its own
data dir is a cache it can lose (issue 52: kill -9 of a gateway and removal of its data dir lose no acknowledged
record). This module holds the parts every store uses:

- a connection pool, and `tx()`, which turns a lost or unreachable database into StoreUnavailable (503 with
  Retry-After: the client's write was not acknowledged, it may retry) and says why in `problem` for health;
- the schema, versioned (`reef_schema`): each MIGRATIONS entry moves it one version up, under an advisory lock so
  services starting at once migrate once; a database of a newer version than this reef_lab knows is refused with
  the fix (upgrade reef_lab) instead of being written in a layout it does not know;
- change notices: `notify(kind, key)` inside the writer's transaction (PostgreSQL delivers it at commit, never for
  a rolled-back change), `on(kind, fn)` to hear them. One LISTEN connection per process; after it reconnects every
  listener is called with key None (a notice may have been missed while it was away: read everything again);
- leases (`lease`): one holder of a name (a scenario's learner) in the whole deployment, with an epoch that grows at
  each new holder, so a holder that paused past its lease finds out before it acts (fencing).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

from reef_lab.errors import Conflict, ReefError, StoreUnavailable
from reef_lab.extras import need

log = logging.getLogger("reef_lab.state")

CHANNEL = "reef_changes"
RETRY_AFTER = "1"

# One entry per schema version: the SQL that moves a database from the version before to this one.
MIGRATIONS: list[str] = [
    # 1: records, scenarios, leases
    """
    CREATE TABLE records (
        seq bigserial NOT NULL,
        id text PRIMARY KEY,
        scenario text NOT NULL,
        kind text NOT NULL,
        content_hash text NOT NULL DEFAULT '',
        stored_at double precision NOT NULL,
        created_at double precision NOT NULL DEFAULT 0,
        episode text,
        caller text,
        row bytea NOT NULL
    );
    CREATE INDEX records_scenario_id ON records (scenario, id);
    CREATE INDEX records_episode ON records (scenario, episode) WHERE episode IS NOT NULL;
    CREATE INDEX records_seq ON records (seq);
    CREATE TABLE scenarios (
        name text PRIMARY KEY,
        body jsonb NOT NULL,
        changed_at double precision NOT NULL
    );
    CREATE TABLE leases (
        name text PRIMARY KEY,
        holder text NOT NULL,
        epoch bigint NOT NULL,
        expires_at timestamptz NOT NULL
    );
    """,
    # 2: documents: a scenario's release index, a learner's ledger (one JSON document each, with a revision so a
    # writer that read an older one is refused instead of overwriting a change it never saw)
    """
    CREATE TABLE documents (
        space text NOT NULL,
        key text NOT NULL,
        body jsonb NOT NULL,
        rev bigint NOT NULL,
        PRIMARY KEY (space, key)
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


class SchemaTooNew(ReefError):
    status, type = 500, "schema_error"


class SharedDoc:
    """One document of the shared state with files.JsonDoc's two methods: what a learner keeps (its ledger) where
    the service that takes its scenario over finds it. Fenced by the learner's lease, so a learner that lost it
    writes nothing."""

    def __init__(self, state: PgState, space: str, key: str, fence: Callable[[], tuple[str, int] | None] = None):
        self.state, self.space, self.key, self._fence = state, space, key, fence
        self._rev = 0

    def read(self) -> dict | None:
        body, self._rev = self.state.read_doc(self.space, self.key)
        return body

    def write(self, body: dict) -> None:
        if not self._rev:  # never read by this process: start from what is stored (revision only)
            _, self._rev = self.state.read_doc(self.space, self.key)
        self._rev = self.state.write_doc(self.space, self.key, body, self._rev,
                                         self._fence() if self._fence is not None else None)


class PgState:
    """A deployment's shared PostgreSQL database, as one process (a gateway, a learner, or both) uses it."""

    def __init__(self, url: str, service: str = "all", pool_size: int = 8, connect_timeout: float = 10.0):
        need("postgres", "--state postgresql://...")
        import psycopg
        from psycopg_pool import ConnectionPool, PoolTimeout

        self._psycopg, self._pool_timeout = psycopg, PoolTimeout
        self.url, self.where = url, redact(url)
        self.service = service
        self.holder = f"{service}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.problem: str | None = None
        self._listeners: dict[str, list[Callable[[str | None], None]]] = {}
        self._closed = threading.Event()
        self._suspect_until = 0.0  # after a lost connection, pooled ones are checked before use until then
        self.pool = ConnectionPool(url, min_size=1, max_size=pool_size, timeout=5.0, open=False,
                                   kwargs={"autocommit": True, "connect_timeout": 5,
                                           "application_name": f"reef_lab {service}"},
                                   reconnect_timeout=0, name="reef_state", check=self._check)
        try:
            self.pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            self.pool.close()
            raise ReefError(f"cannot reach PostgreSQL at {self.where} within {connect_timeout:.0f} s: check that it "
                            "runs, that this machine may connect (pg_hba.conf) and the user, password and database "
                            "in --state") from None
        self._migrate()
        self._listening = threading.Event()
        self._listener = threading.Thread(target=self._listen, name="reef-state-listen", daemon=True)
        self._listener.start()
        # a notice sent before LISTEN is lost: what this process reads next (its scenarios, releases) must not
        # miss a change made between that read and the listener's start
        if not self._listening.wait(connect_timeout):
            log.warning("the state listener of %s is not listening yet: changes made elsewhere arrive once it is",
                        self.where)

    # --- transactions -----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def connection(self) -> Iterator:
        """A pooled connection (autocommit). A database that is down or unreachable raises StoreUnavailable."""
        try:
            with self.pool.connection() as conn:
                yield conn
            self.problem = None
        except (self._psycopg.OperationalError, self._psycopg.InterfaceError, self._pool_timeout) as e:
            raise self._unavailable(e) from None

    @contextlib.contextmanager
    def tx(self) -> Iterator:
        """A connection inside one transaction: committed when the block ends, rolled back if it raises."""
        with self.connection() as conn:
            try:
                with conn.transaction():
                    yield conn
            except (self._psycopg.OperationalError, self._psycopg.InterfaceError) as e:
                raise self._unavailable(e) from None

    @property
    def lost(self) -> tuple[type[Exception], ...]:
        """The psycopg errors that mean the database or the connection is gone (not a bad statement)."""
        return (self._psycopg.OperationalError, self._psycopg.InterfaceError)

    def connect(self):
        """A connection of its own (autocommit), outside the pool: for a writer that keeps one (the record store's
        group commit skips the pool's hand-over that way). StoreUnavailable when the database cannot be reached."""
        try:
            conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                                         application_name=f"reef_lab {self.service} writer")
        except self.lost as e:
            raise self._unavailable(e) from None
        self.problem = None
        return conn

    def unavailable(self, e: Exception) -> StoreUnavailable:
        """The 503 to answer for a lost database (and `problem` set for health)."""
        return self._unavailable(e)

    def _check(self, conn) -> None:
        """The pool's check of a connection it hands out: a round trip, paid only for a while after a connection was
        lost (a restarted database leaves every pooled connection dead; each would fail its next use once)."""
        if time.monotonic() < self._suspect_until:
            conn.execute("SELECT 1")

    def _unavailable(self, e: Exception) -> StoreUnavailable:
        self._suspect_until = time.monotonic() + 60
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        self.problem = f"PostgreSQL at {self.where} is unavailable: {first}"
        err = StoreUnavailable(f"{self.problem}; nothing was written, retry shortly")
        err.headers = {"retry-after": RETRY_AFTER}
        return err

    def check(self) -> str | None:
        """None when the database answers now, else why not (for health)."""
        try:
            with self.connection() as conn:
                conn.execute("SELECT 1")
            return None
        except StoreUnavailable:
            return self.problem

    # --- schema -----------------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(7265656600)")  # one service migrates at a time
            conn.execute("CREATE TABLE IF NOT EXISTS reef_schema (one int PRIMARY KEY CHECK (one = 1), "
                         "version int NOT NULL)")
            row = conn.execute("SELECT version FROM reef_schema").fetchone()
            version = row[0] if row else 0
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(f"the database at {self.where} holds reef_lab's state in schema version {version}; "
                                   f"this reef_lab knows versions up to {SCHEMA_VERSION}: upgrade reef_lab on this "
                                   "machine to the version the other services run (a database is never moved back)")
            for v in range(version, SCHEMA_VERSION):
                conn.execute(MIGRATIONS[v])
                log.info("state schema of %s moved to version %d", self.where, v + 1)
            conn.execute("INSERT INTO reef_schema (one, version) VALUES (1, %s) ON CONFLICT (one) DO UPDATE "
                         "SET version = EXCLUDED.version", (SCHEMA_VERSION,))

    # --- change notices ---------------------------------------------------------------------------------------

    def notify(self, conn, kind: str, key: str = "") -> None:
        """Tell every service that `kind` changed for `key` once `conn`'s transaction commits."""
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{kind}:{key}"))

    def on(self, kind: str, fn: Callable[[str | None], None]) -> None:
        """Call `fn(key)` (in the listener's thread) on each notice of `kind`; `fn(None)`: read everything again."""
        self._listeners.setdefault(kind, []).append(fn)

    def _fire(self, kind: str, key: str | None) -> None:
        for fn in list(self._listeners.get(kind, ())):
            try:
                fn(key)
            except Exception:  # a listener's failure must not stop the notices of the others
                log.exception("state listener for %r failed", kind)

    def _listen(self) -> None:
        first = True
        while not self._closed.is_set():
            try:
                conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=5,
                                             application_name=f"reef_lab {self.service} listener")
            except self._psycopg.OperationalError as e:
                self.problem = f"PostgreSQL at {self.where} is unavailable: {str(e).strip().splitlines()[0]}"
                self._closed.wait(1.0)
                continue
            try:
                with conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    if not first:  # notices sent while it was away are lost: every listener reads again
                        for kind in list(self._listeners):
                            self._fire(kind, None)
                    first = False
                    while not self._closed.is_set():
                        for n in conn.notifies(timeout=1.0):
                            kind, _, key = n.payload.partition(":")
                            self._fire(kind, key)
            except (self._psycopg.OperationalError, self._psycopg.InterfaceError) as e:
                if not self._closed.is_set():
                    log.warning("state listener lost PostgreSQL (%s); reconnecting", str(e).strip()[:200])
                    self._closed.wait(1.0)

    # --- documents ----------------------------------------------------------------------------------------------

    def read_doc(self, space: str, key: str) -> tuple[dict | None, int]:
        """A document and its revision (None, 0 when there is none)."""
        with self.connection() as conn:
            row = conn.execute("SELECT body, rev FROM documents WHERE space = %s AND key = %s", (space, key)).fetchone()
        return (None, 0) if row is None else (row[0], row[1])

    def find_docs(self, space: str, field: str, value: str) -> list[dict]:
        """The documents of `space` whose top-level `field` is `value` (a scenario's change requests)."""
        with self.connection() as conn:
            return [r[0] for r in conn.execute("SELECT body FROM documents WHERE space = %s AND body ->> %s = %s",
                                               (space, field, value))]

    def write_doc(self, space: str, key: str, body: dict, rev: int, fence: tuple[str, int] | None = None,
                  notice: str | None = None) -> int:
        """Replace a document read at revision `rev` (0: new) and notify `space:key`; its new revision. Conflict when
        it changed since (someone else wrote it) or, with `fence` (lease name, epoch), when this process no longer
        holds that lease: a learner that paused past its lease writes nothing. `notice`: the key the notice
        carries (default `key`)."""
        from psycopg.types.json import Jsonb

        with self.tx() as conn:
            if fence is not None and not self.holds(conn, *fence):
                raise Conflict(f"this process no longer holds the lease {fence[0]!r} (another service took it over "
                               "after it paused or lost the database): nothing was written")
            row = conn.execute(
                "INSERT INTO documents (space, key, body, rev) VALUES (%s, %s, %s, 1) ON CONFLICT (space, key) DO "
                "UPDATE SET body = EXCLUDED.body, rev = documents.rev + 1 WHERE documents.rev = %s RETURNING rev",
                (space, key, Jsonb(body), rev)).fetchone()
            if row is None or (rev == 0 and row[0] != 1):
                raise Conflict(f"{space} {key!r} changed while this service updated it: read it again and retry")
            self.notify(conn, space, key if notice is None else notice)
        return row[0]

    def doc_keys(self, space: str) -> list[str]:
        with self.connection() as conn:
            return [r[0] for r in conn.execute("SELECT key FROM documents WHERE space = %s ORDER BY key", (space,))]

    # --- leases -----------------------------------------------------------------------------------------------

    def lease(self, name: str, seconds: float) -> int | None:
        """Take or renew the lease on `name` for `seconds` (the database's clock): its epoch when this process holds
        it now, None when another holder's lease has not run out. A new holder gets a higher epoch than any before."""
        with self.tx() as conn:
            row = conn.execute(
                "INSERT INTO leases (name, holder, epoch, expires_at) VALUES (%s, %s, 1, now() + %s * interval '1 s') "
                "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, "
                "epoch = CASE WHEN leases.holder = EXCLUDED.holder THEN leases.epoch ELSE leases.epoch + 1 END "
                "WHERE leases.holder = EXCLUDED.holder OR leases.expires_at < now() "
                "RETURNING epoch", (name, self.holder, seconds)).fetchone()
        return None if row is None else row[0]

    def holds(self, conn, name: str, epoch: int) -> bool:
        """Inside a transaction: whether this process still holds `name` at `epoch` (row-locked until commit, so a
        write fenced by it cannot race a takeover)."""
        row = conn.execute("SELECT 1 FROM leases WHERE name = %s AND holder = %s AND epoch = %s AND "
                           "expires_at > now() FOR UPDATE", (name, self.holder, epoch)).fetchone()
        return row is not None

    def renew(self, names: list[str], seconds: float) -> set[str]:
        """Renew this process's unexpired leases among `names` in one statement; the names it still holds."""
        with self.connection() as conn:
            rows = conn.execute("UPDATE leases SET expires_at = now() + %s * interval '1 s' WHERE holder = %s AND "
                                "name = ANY(%s) AND expires_at > now() RETURNING name",
                                (seconds, self.holder, names)).fetchall()
        return {r[0] for r in rows}

    def release_lease(self, name: str) -> None:
        with contextlib.suppress(StoreUnavailable), self.tx() as conn:
            conn.execute("UPDATE leases SET expires_at = now() - interval '1 s' WHERE name = %s AND holder = %s",
                         (name, self.holder))

    def lease_holders(self, prefix: str = "") -> dict[str, str]:
        """Who holds each unexpired lease whose name starts with `prefix` (for status)."""
        with self.connection() as conn:
            rows = conn.execute("SELECT name, holder FROM leases WHERE name LIKE %s AND expires_at > now()",
                                (prefix.replace("%", r"\%") + "%",)).fetchall()
        return dict(rows)

    def close(self) -> None:
        self._closed.set()
        self._listener.join(timeout=3)
        self.pool.close()


class LeaseKeeper:
    """The leases this process holds: taken on demand (`claim`), renewed together every ttl/3 seconds, given back
    on close. A lease it could not renew before it ran out is lost: `on_lost(name)` stops what it guarded, and
    `fence(name)` keeps naming its old epoch, so a write fenced by it is refused from then on. `on_tick()` runs
    after each renewal (a learner service looks there for scenarios nobody learns).

    Why a lease and not a lock file: the services of a shared deployment run on different machines; the database
    is what they all see, and its clock decides who holds what."""

    def __init__(self, state: PgState, ttl: float = 10.0, on_lost: Callable[[str], None] | None = None,
                 on_tick: Callable[[], None] | None = None):
        self.state, self.ttl, self.on_lost, self.on_tick = state, ttl, on_lost, on_tick
        self.held: dict[str, int] = {}  # name -> epoch, while held
        self._epochs: dict[str, int] = {}  # every lease held since start (a lost one fences its old epoch)
        self._lock = threading.Lock()
        self._renewed = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="reef-leases", daemon=True)

    def start(self) -> LeaseKeeper:
        """Start renewing (and ticking): once what `on_tick` reads is built."""
        self._thread.start()
        return self

    def claim(self, name: str) -> bool:
        """Whether this process holds `name` now (taken if it was free)."""
        if name in self.held:
            return True
        try:
            epoch = self.state.lease(name, self.ttl)
        except StoreUnavailable:
            return False
        if epoch is None:
            return False
        with self._lock:
            if not self.held:  # the only lease now: it runs from this claim (with others, their older renewal counts)
                self._renewed = time.monotonic()
            self.held[name] = self._epochs[name] = epoch
        return True

    def drop(self, name: str) -> None:
        """Give a lease back now (its work is gone here: a deleted scenario)."""
        with self._lock:
            held = self.held.pop(name, None)
        if held is not None:
            self.state.release_lease(name)

    def fence(self, name: str) -> tuple[str, int] | None:
        """(name, epoch) for a lease this process holds or held (writes check it), None for one it never held."""
        epoch = self._epochs.get(name)
        return None if epoch is None else (name, epoch)

    def _loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            names = list(self.held)
            if names:
                try:
                    kept = self.state.renew(names, self.ttl)
                    self._renewed = time.monotonic()
                except StoreUnavailable:
                    # not renewed; once a whole lease time has passed since the last renewal, another service may
                    # hold them: stop now rather than act on a lease that has run out
                    kept = set(names) if time.monotonic() - self._renewed < self.ttl * 0.8 else set()
                for name in names:
                    if name not in kept:
                        with self._lock:
                            self.held.pop(name, None)
                        log.warning("lost the lease %s (not renewed in time): its work stops here", name)
                        if self.on_lost is not None:
                            self.on_lost(name)
            if self.on_tick is not None:
                try:
                    self.on_tick()
                except StoreUnavailable:
                    pass
                except Exception:  # noqa: BLE001 - the next tick tries again
                    log.exception("lease tick failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for name in list(self.held):
            self.state.release_lease(name)
        self.held.clear()
