"""What a gateway call answers: a whole reply or a stream of server-sent events, with reef_lab's headers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

RECEIPT_HEADER = "x-reef-agent-record-id"
RELEASE_HEADER = "x-reef-release-id"
COMPONENTS_HEADER = "x-reef-release-components"


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    record: dict | None = None  # the stored record (in-process callers; the HTTP layer sends only the reply)


@dataclass
class StreamReply:
    events: Iterator[bytes]
    headers: dict[str, str] = field(default_factory=dict)
    cancel: Callable[[], None] | None = None  # stops the generation when the server sees the client go (any thread)


def release_header_values(release: str | None, components: dict | None) -> dict[str, str]:
    """The release headers of an answer: the release id, and for a composite release its components."""
    out = {RELEASE_HEADER: release} if release is not None else {}
    if components:
        out[COMPONENTS_HEADER] = ",".join(f"{k}={v}" for k, v in sorted(components.items()))
    return out
