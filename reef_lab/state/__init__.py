"""Where a deployment keeps what it knows: its data dir (the embedded default, one machine, no database to start)
or PostgreSQL (`scripts/serve.py --state postgresql://user@host:port/db`), which several gateways and learners on
different machines share.

The seam is one store class per kind of state, chosen by the spec: the records (reef_lab/records/store.py or
reef_lab/records/postgres.py), the scenarios' configs (reef_lab/scenarios.py's backends), and so on; this room
holds only the shared database itself (reef_lab/state/postgres.py: the connection pool, the versioned schema, the
change notices every service listens to, and leases). psycopg is imported only when a PostgreSQL spec is opened.
"""

from __future__ import annotations

SCHEMES = ("postgresql://", "postgres://")


def is_shared(spec: str | None) -> bool:
    """Whether `spec` names a PostgreSQL database (else: the data dir)."""
    return bool(spec) and str(spec).startswith(SCHEMES)


def check_spec(spec: str | None) -> str | None:
    """The spec as given (None: the data dir), or ValueError naming what `--state` accepts."""
    if spec in (None, "", "data-dir"):
        return None
    if not is_shared(spec):
        raise ValueError(f"--state {spec!r}: give 'data-dir' (the default: everything in the data dir) or a "
                         "PostgreSQL URL, postgresql://user@host:port/database")
    return str(spec)


def open_state(spec: str, service: str = "all"):
    """The shared database named by `spec` (a PgState): its schema created or checked, its change notices
    listened to. `service` names this process in leases and logs."""
    from reef_lab.state.postgres import PgState
    return PgState(spec, service=service)
