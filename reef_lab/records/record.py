"""Records: the append-only facts reef_lab keeps about every interaction.

A record is one inference (request, response, tokens and logprobs, the release that served it), one report
(score, feedback, the receipts it references) or one training event. Records never change once written; a
receipt (`x-reef-agent-record-id`) is a record id. This module holds the record type, its id scheme, its
content hash (for idempotent client-chosen ids) and its Parquet schema.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import polars as pl

SCHEMA_VERSION = 3  # 2 added stored_at, 3 episode; older segments read with them null (see store.scan_segments)
KINDS = ("inference", "report", "train")
# ok: answered; error: failed (engine, upstream 5xx); refused: a 4xx, the request as sent and why (docs/episodes.md);
# cancelled: the client left a stream, with what was generated until then. Only `ok` records train.
STATUSES = ("ok", "error", "refused", "cancelled")
DIALECTS = ("openai.chat", "openai.responses", "anthropic.messages", "")

def new_record_id(now: float | None = None) -> str:
    """A time-sortable id: 48-bit milliseconds then 80 random bits, in fixed-width hex (cheap to make in C)."""
    ms = int((time.time() if now is None else now) * 1000)
    return f"rec_{ms:012x}{os.urandom(10).hex()}"


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
    stored_at: float = 0.0  # server time of the write (created_at may be a client's, for imports)
    content_hash: str = ""  # set for client-chosen ids (see content_hash()); server ids never repeat
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if not self.created_at:
            self.created_at = time.time()

    def to_dict(self) -> dict:
        """A shallow dict (dataclasses.asdict deep-copies every nested value, ~20x slower on the hot path)."""
        return {k: getattr(self, k) for k in _FIELDS}


_FIELDS = tuple(Record.__dataclass_fields__)
_HASHED = ("scenario", "kind", "dialect", "request", "response", "token_ids", "logprobs", "tags", "references",
           "score", "feedback", "metadata")


def content_hash(r: Record) -> str:
    """Hash of what a client supplied: a repeated client-chosen id with the same hash is the same record."""
    fields = {k: getattr(r, k) for k in _HASHED}
    if r.episode is not None:  # only when set: records hashed before episodes existed keep their hash
        fields["episode"] = r.episode
    payload = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


JSON_COLUMNS = ("request", "response", "tags", "timing", "feedback", "metadata")

PARQUET_SCHEMA = {
    "id": pl.String, "scenario": pl.String, "kind": pl.String, "dialect": pl.String,
    "created_at": pl.Float64, "request": pl.String, "response": pl.String,
    "prompt_token_ids": pl.List(pl.Int64), "token_ids": pl.List(pl.Int64), "logprobs": pl.List(pl.Float64),
    "release_id": pl.String, "tags": pl.String, "timing": pl.String, "references": pl.List(pl.String),
    "score": pl.Float64, "feedback": pl.String, "metadata": pl.String, "status": pl.String, "error": pl.String,
    "episode": pl.String, "stored_at": pl.Float64, "content_hash": pl.String, "schema_version": pl.Int32,
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
    return out
