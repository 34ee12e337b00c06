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
import uuid
from typing import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

from reef_lab.errors import ReefError, StoreUnavailable
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
        self.pool = ConnectionPool(url, min_size=1, max_size=pool_size, timeout=5.0, open=False,
                                   kwargs={"autocommit": True, "connect_timeout": 5,
                                           "application_name": f"reef_lab {service}"},
                                   reconnect_timeout=0, name="reef_state")
        try:
            self.pool.open(wait=True, timeout=connect_timeout)
        except PoolTimeout:
            self.pool.close()
            raise ReefError(f"cannot reach PostgreSQL at {self.where} within {connect_timeout:.0f} s: check that it "
                            "runs, that this machine may connect (pg_hba.conf) and the user, password and database "
                            "in --state") from None
        self._migrate()
        self._listener = threading.Thread(target=self._listen, name="reef-state-listen", daemon=True)
        self._listener.start()

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

    def _unavailable(self, e: Exception) -> StoreUnavailable:
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
