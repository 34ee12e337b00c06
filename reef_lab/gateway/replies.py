"""What a gateway call answers: a whole reply or a stream of server-sent events, with reef_lab's headers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

RECEIPT_HEADER = "x-reef-agent-record-id"
RELEASE_HEADER = "x-reef-release-id"


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class StreamReply:
    events: Iterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)
