"""Request helpers shared by the Flask blueprints and the hot-route middleware."""

from __future__ import annotations

import hmac

import orjson
from flask import Response, request

from reef_lab.errors import BadRequest, ReefError, Unauthorized
from reef_lab.gateway import Reply, StreamReply

TAG_PREFIX = "x-reef-tag-"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def parse_json(data: bytes):
    if not data:
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None


def check_token(tokens: list[bytes], authorization: str, api_key: str) -> None:
    """Accept `Authorization: Bearer <token>` or `x-api-key: <token>`; every token compared in constant time."""
    if not tokens:
        return
    given = (authorization[7:] if authorization[:7].lower() == "bearer " else api_key).encode()
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(given, t)
    if not ok:
        raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <REEF_TOKEN>' "
                           "(or 'x-api-key' for Anthropic clients)")


def error_body(path: str, err: ReefError) -> bytes:
    """The error in the wire format of the API the client called (`detail` too, as Reef's clients read it)."""
    if path.startswith("/v1/messages"):
        return orjson.dumps({"type": "error", "error": {"type": err.type, "message": err.message}})
    body = {"error": {"message": err.message, "type": err.type, "param": None, "code": None}}
    if path.startswith("/reef/"):
        body["detail"] = err.message
    return orjson.dumps(body)


def json_body():
    return parse_json(request.get_data(cache=False))


def tags() -> dict[str, str]:
    return {k[len(TAG_PREFIX):].lower(): v for k, v in request.headers.items() if k.lower().startswith(TAG_PREFIX)}


def scenario() -> str | None:
    return request.headers.get("x-reef-scenario")


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(obj), status=status, mimetype="application/json", headers=headers)


def to_response(reply: Reply | StreamReply) -> Response:
    if isinstance(reply, StreamReply):
        return Response(reply.events, status=200, mimetype="text/event-stream", headers={**SSE_HEADERS,
                                                                                        **reply.headers})
    return Response(reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers)
