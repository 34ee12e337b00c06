"""Which of a client's headers the upstream relay passes to the provider, and which credential it sends.

Passed: whatever the client sent (its session ids such as Claude Code's `x-claude-code-session-id` or Codex's
`session-id`, its `user-agent`, SDK headers such as `x-stainless-*`, provider headers such as `anthropic-beta` or
`openai-organization`), except:
- hop-by-hop and framing headers (RFC 9110 7.6.1: connection, keep-alive, te, trailer, transfer-encoding, upgrade,
  proxy-*), `host`, `content-length`, `content-type`, `content-encoding`, `expect`: this hop sets its own;
- `accept-encoding`: the relay reads the provider's answer (records, translation) and asks for it uncompressed;
- browser and network context (`cookie`, `origin`, `referer`, `sec-*`, `forwarded`, `x-forwarded-*`, `x-real-ip`,
  `via`): the provider gets the request from reef_lab, not from the user's browser or address;
- reef_lab's own headers (`x-reef-*`) and credentials (`authorization`, `x-api-key`): see below;
- the other provider family's headers (`anthropic-*` to an OpenAI-dialect provider, `openai-*` to an Anthropic one).
A value holding a line break is never passed.

The credential: the deployment's key (REEF_UPSTREAM_API_KEY) when it has one; otherwise, with
`--upstream-key-from-client`, the client's own `x-api-key` or `Authorization: Bearer` (bring your own key), sent
the way the provider's dialect expects it. The server removes a header carrying a REEF_TOKEN before the gateway
sees the request, so reef_lab's own token can never be forwarded.
"""

from __future__ import annotations

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
              "trailer", "trailers", "transfer-encoding", "upgrade"}
NEVER = HOP_BY_HOP | {"host", "content-length", "content-type", "content-encoding", "expect", "accept-encoding",
                      "cookie", "origin", "referer", "forwarded", "via", "x-real-ip", "authorization", "x-api-key"}
NEVER_PREFIXES = ("x-reef-", "sec-", "x-forwarded-")
ANTHROPIC_VERSION = "2023-06-01"


def client_key(client_headers: dict[str, str]) -> str | None:
    """The provider key a client sent: `x-api-key`, else `Authorization: Bearer <key>`."""
    key = client_headers.get("x-api-key", "").strip()
    if key:
        return key
    auth = client_headers.get("authorization", "")
    if auth[:7].lower() != "bearer ":
        return None
    return auth[7:].strip() or None


def upstream_headers(client_headers: dict[str, str], anthropic: bool, api_key: str | None,
                     key_from_client: bool) -> dict[str, str]:
    """The headers of the provider request. `client_headers` have lower-case names; `anthropic` says the provider
    speaks Anthropic messages (else an OpenAI dialect)."""
    other = "openai-" if anthropic else "anthropic-"
    out = {k: v for k, v in client_headers.items()
           if k not in NEVER and not k.startswith(NEVER_PREFIXES) and not k.startswith(other)
           and "\r" not in v and "\n" not in v}
    out["content-type"] = "application/json"
    key = api_key or (client_key(client_headers) if key_from_client else None)
    if key and ("\r" in key or "\n" in key):
        key = None
    if anthropic:
        out.setdefault("anthropic-version", ANTHROPIC_VERSION)
        if key:
            out["x-api-key"] = key
    elif key:
        out["authorization"] = f"Bearer {key}"
    return out
