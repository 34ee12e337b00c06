"""Records: the append-only facts reef_lab keeps about every interaction.

A record is one inference (request, response, tokens and logprobs, the release that served it), one report
(score, feedback, the receipts it references) or one training event. Records never change once written; a
receipt (`x-reef-agent-record-id`) is a record id. This module holds the record type, its id scheme, its
content hash (for idempotent client-chosen ids) and its Parquet schema.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
import polars as pl

from reef_lab import wire
from reef_lab.errors import BadRequest

SCHEMA_VERSION = 5  # 2 added stored_at, 3 episode, 4 caller, 5 context; older segments read them as null (segments.py)
KINDS = ("inference", "report", "train", "eval")  # eval: a held-out answer a candidate was judged on
# ok: answered; error: failed (engine, upstream 5xx); refused: a 4xx, the request as sent and why (docs/episodes.md);
# cancelled: the client left a stream, with what was generated until then. Only `ok` records train.
STATUSES = ("ok", "error", "refused", "cancelled")
DIALECTS = (*wire.DIALECTS, "")
MAX_CONTEXT_CHARS = 32_000  # the longest teacher context a report may carry (a scenario's recipe may take less)

_last_id = [0, 0]  # this process's last (milliseconds, sequence)
_id_lock = threading.Lock()


def new_record_id(now: float | None = None) -> str:
    """A time-sortable id: 48-bit milliseconds, a 16-bit sequence within the millisecond, 64 random bits, in
    fixed-width hex. Ids a process makes sort in the order it made them, also within one millisecond (with random
    bits there, the records of one imported batch came back from a sorted read, and so reached a learner, in a
    different order each run: issue 39)."""
    ms = int((time.time() if now is None else now) * 1000)
    with _id_lock:
        last_ms, seq = _last_id
        if ms <= last_ms:  # the same millisecond, or a clock that stepped back: keep counting from the last id
            ms, seq = last_ms, seq + 1
            if seq > 0xFFFF:
                ms, seq = last_ms + 1, 0
        else:
            seq = 0
        _last_id[:] = [ms, seq]
    return f"rec_{ms:012x}{seq:04x}{os.urandom(8).hex()}"


@dataclass
class Record:
    """One append-only fact. JSON-valued fields (request, response, feedback, metadata, tags, timing) are kept
    as Python values here and as JSON text in Parquet."""

    id: str
    scenario: str
    kind: str
    dialect: str = ""
    created_at: float = 0.0
    request: Any = None
    response: Any = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    release_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)
    score: float | None = None
    feedback: Any = None
    metadata: Any = None
    status: str = "ok"
    error: str | None = None
    episode: str | None = None  # the agent session this call belongs to (reef_lab/gateway/episodes.py)
    caller: str | None = None  # the id of the token that made it (reef_lab/tenants.py; None: auth off), never the token
    context: str | None = None  # a report's teacher context: words the student did not see (docs/api.md, reports)
    stored_at: float = 0.0  # server time of the write (created_at may be a client's, for imports)
    content_hash: str = ""  # set for client-chosen ids (see content_hash()); server ids never repeat
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.created_at:
            self.created_at = time.time()

    def to_dict(self) -> dict:
        """A shallow dict (dataclasses.asdict deep-copies every nested value, ~20x slower on the hot path)."""
        return {k: getattr(self, k) for k in _FIELDS}

    @classmethod
    def from_client(cls, item: Any, default_scenario: str | None = None) -> Record:
        """A record a client imports (POST /reef/records/batch), parsed against CLIENT_FIELDS: BadRequest naming
        the first field that does not fit. References are returned as given; whether they name known receipts is
        the caller's to check (reef_lab.gateway.reports). The content hash makes a repeated import idempotent."""
        from reef_lab.scenarios import check_name  # the scenario names' rule lives with the scenarios

        if not isinstance(item, dict):
            raise BadRequest("a record must be an object")
        unknown = set(item) - set(CLIENT_FIELDS)
        if unknown:
            raise BadRequest(f"unknown field(s) {sorted(unknown)}; a record has {list(CLIENT_FIELDS)}")
        for key, (fits, what) in CLIENT_FIELDS.items():
            value = item.get(key)
            if value is not None and not fits(value):
                raise BadRequest(f"'{key}' must be {what}, got {shown(value)}")
        check_context(item.get("context"), item.get("kind") or "inference")
        lp, tokens = item.get("logprobs"), item.get("token_ids")
        if lp is not None and len(lp) != len(tokens or []):
            raise BadRequest("'logprobs' must have one entry per token in 'token_ids'")
        rec = cls(id=client_id(item.get("id")), scenario=check_name(item.get("scenario") or default_scenario),
                  kind=item.get("kind") or "inference", dialect=item.get("dialect") or "",
                  created_at=float(item.get("created_at") or 0), request=item.get("request"),
                  response=item.get("response"), prompt_token_ids=item.get("prompt_token_ids"), token_ids=tokens,
                  logprobs=None if lp is None else [float(x) for x in lp], release_id=item.get("release_id"),
                  tags=item.get("tags") or {}, timing=item.get("timing") or {},
                  references=list(item.get("references") or []),
                  score=None if item.get("score") is None else float(item["score"]), feedback=item.get("feedback"),
                  metadata=item.get("metadata"), status=item.get("status") or "ok", error=item.get("error"),
                  episode=item.get("episode"), context=item.get("context"))
        rec.content_hash = content_hash(rec)
        return rec


def inference_record(name: str, dialect: str, body: Any, tags: dict, response: Any, t0: float,
                     kind: str = "inference", **kw) -> Record:
    """The record of one call, whichever path served it (generation, the relay, a refusal), timed from `t0`
    (time.perf_counter) to now."""
    return Record(id=new_record_id(), scenario=name, kind=kind, dialect=dialect, request=body,
                  response=response, tags=tags,
                  timing={"total_ms": round((time.perf_counter() - t0) * 1e3, 3), **kw.pop("timing", {})}, **kw)


_FIELDS = tuple(Record.__dataclass_fields__)
# The one rule of every id a client names: a record's, an episode's or session's (1-128 letters, digits, _ . : -).
ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _token_ids(v: Any) -> bool:
    return isinstance(v, list) and all(type(t) is int and 0 <= t < 2**31 for t in v)


def _is(*types: type) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, types)


# What a client may set on an imported record: field -> (check of a non-null value, what it must be).
CLIENT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (_is(str), "a string"),
    "scenario": (_is(str), "a scenario name"),
    "kind": (lambda v: v in KINDS, f"one of {list(KINDS)}"),
    "dialect": (lambda v: isinstance(v, str) and v in DIALECTS, f"one of {list(DIALECTS[:-1])} or empty"),
    "created_at": (lambda v: _number(v) and v > 0, "a positive unix time in seconds"),
    "request": (lambda v: True, "any JSON value"),
    "response": (lambda v: True, "any JSON value"),
    "prompt_token_ids": (_token_ids, "a list of token ids (integers in 0..2^31-1)"),
    "token_ids": (_token_ids, "a list of token ids (integers in 0..2^31-1)"),
    "logprobs": (lambda v: isinstance(v, list) and all(_number(x) for x in v), "a list of finite numbers"),
    "release_id": (_is(str), "a string"),
    "tags": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
             "an object of strings"),
    "timing": (_is(dict), "an object"),
    "references": (lambda v: isinstance(v, list) and all(isinstance(r, str) for r in v),
                   "a list of receipts (x-reef-agent-record-id values)"),
    "score": (_number, "a finite number"),
    "feedback": (_is(str, dict), "a string or an object"),
    "context": (_is(str), "a string (a report's teacher context)"),
    "metadata": (lambda v: True, "any JSON value"),
    "status": (_is(str), "a string"),
    "error": (_is(str), "a string"),
    "episode": (lambda v: isinstance(v, str) and bool(ID_RE.match(v)),
                "an episode id (1-128 letters, digits, '_', '.', ':' or '-')"),
}


def check_context(context: Any, kind: str = "report") -> None:
    """A report's teacher context: a non-empty string of at most MAX_CONTEXT_CHARS characters, on reports only."""
    if context is None:
        return
    if kind != "report":
        raise BadRequest(f"'context' is a report's field (the words a teacher sees); this record is a {kind}")
    if not isinstance(context, str) or not context.strip():
        raise BadRequest(f"'context' must be a non-empty string (a correction, the right answer, a worked example), "
                         f"got {shown(context)}")
    if len(context) > MAX_CONTEXT_CHARS:
        raise BadRequest(f"'context' has {len(context)} characters; a report takes at most {MAX_CONTEXT_CHARS}")


def client_id(rid: Any) -> str:
    """A client-chosen record id, checked (a new server id when none is given)."""
    if rid is None:
        return new_record_id()
    if not isinstance(rid, str) or not ID_RE.match(rid):
        raise BadRequest(f"record id {shown(rid)} is invalid: use 1-128 letters, digits, '_', '.', ':' or '-'")
    return rid


def shown(value: Any, width: int = 60) -> str:
    """A client's value quoted in an error message: its repr, cut short (a value can be large or deep)."""
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) else f"a {type(value).__name__}"
    return text if len(text) <= width else text[:width] + "..."
_HASHED = ("scenario", "kind", "dialect", "request", "response", "token_ids", "logprobs", "tags", "references",
           "score", "feedback", "metadata")


def content_hash(r: Record) -> str:
    """Hash of what a client supplied: a repeated client-chosen id with the same hash is the same record."""
    fields = {k: getattr(r, k) for k in _HASHED}
    if r.episode is not None:  # only when set: records hashed before episodes existed keep their hash
        fields["episode"] = r.episode
    if r.context is not None:  # likewise for a report's context (schema 5)
        fields["context"] = r.context
    payload = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


JSON_COLUMNS = ("request", "response", "tags", "timing", "feedback", "metadata")

PARQUET_SCHEMA = {
    "id": pl.String, "scenario": pl.String, "kind": pl.String, "dialect": pl.String,
    "created_at": pl.Float64, "request": pl.String, "response": pl.String,
    "prompt_token_ids": pl.List(pl.Int64), "token_ids": pl.List(pl.Int64), "logprobs": pl.List(pl.Float64),
    "release_id": pl.String, "tags": pl.String, "timing": pl.String, "references": pl.List(pl.String),
    "score": pl.Float64, "feedback": pl.String, "metadata": pl.String, "status": pl.String, "error": pl.String,
    "episode": pl.String, "caller": pl.String, "context": pl.String, "stored_at": pl.Float64, "content_hash": pl.String,
    "schema_version": pl.Int32,
}


def records_to_frame(records: list[dict]) -> pl.DataFrame:
    """Record dicts to the Parquet layout: JSON-valued fields become JSON text."""
    cols: dict[str, list] = {}
    for k in PARQUET_SCHEMA:
        if k in JSON_COLUMNS:
            cols[k] = [None if (v := r.get(k)) is None else orjson.dumps(v).decode() for r in records]
        else:
            cols[k] = [r.get(k) for r in records]
    return pl.DataFrame(cols, schema=PARQUET_SCHEMA)


def frame_row_to_dict(row: dict) -> dict:
    """One row of the Parquet layout back to a record dict (JSON text parsed)."""
    out = dict(row)
    for k in JSON_COLUMNS:
        v = out.get(k)
        out[k] = None if v is None else orjson.loads(v)
    if out.get("tags") is None:
        out["tags"] = {}
    if out.get("timing") is None:
        out["timing"] = {}
    if out.get("references") is None:
        out["references"] = []
    out.setdefault("episode", None)  # rows written before schema 3
    out.setdefault("caller", None)  # before schema 4
    out.setdefault("context", None)  # before schema 5
    return out
