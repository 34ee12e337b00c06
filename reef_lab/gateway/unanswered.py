"""Nothing unrecorded: a call that was refused (4xx) or that its client abandoned mid-stream still becomes a record,
with one log line, so the records tell every call a client made and what came of it.

- `refused`: the gateway, the engine or the provider answered 4xx. The record keeps the request as sent, the
  reason (`error`) and the HTTP status (`timing` stays the time it took, `metadata.refused_status` the code).
  Requests refused before they reach the gateway (no valid scenario, a bad token, a body over the size limit or
  not JSON) cannot name a scenario or are not to be written by an unauthenticated sender: those get the log line
  only.
- `cancelled`: the client closed a stream before its end. The record keeps what was generated until then
  (embedded engine: the text sent so far in `metadata.generated_text`; relay: the accumulated partial answer in
  `response`) and why it ended.

Neither status ever trains: samples are built from `ok` records only (reef_lab/trainers/samples.py,
reef_lab/learning/episodes.py).
"""

from __future__ import annotations

import logging
from typing import Any

from reef_lab.errors import ReefError
from reef_lab.records.record import inference_record

log = logging.getLogger("reef_lab.gateway.unanswered")


def is_refusal(err: ReefError) -> bool:
    return 400 <= err.status < 500


def record_refused(store, name: str, dialect: str, body: Any, tags: dict, t0: float, err: ReefError,
                   episode: str | None, release: str | None = None, caller: str | None = None) -> str:
    """Store the refused call in `store` (the primary's RecordStore or a relay worker's log)."""
    rec = inference_record(name, dialect, body, tags, None, t0, status="refused", error=err.message,
                           release_id=release, episode=episode, metadata={"refused_status": err.status},
                           caller=caller)
    store.append([rec])
    log.info("refused %s call in scenario %s with HTTP %d (record %s): %s", dialect, name, err.status, rec.id,
             err.message[:300])
    return rec.id


def log_unrecorded(dialect: str | None, why: str, err: ReefError) -> None:
    """The one line for a refusal that is not recorded (`why`: no valid scenario, or refused before the gateway)."""
    log.info("refused %s call (not recorded: %s) with HTTP %d: %s", dialect or "a", why, err.status,
             err.message[:300])


def log_cancelled(name: str, dialect: str, record_id: str, reason: str) -> None:
    log.info("cancelled %s stream in scenario %s (record %s): %s", dialect, name, record_id, reason[:300])
