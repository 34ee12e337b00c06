"""Request helpers shared by the blueprints."""

from __future__ import annotations

import orjson
from flask import Response, request

from reef_lab.errors import BadRequest
from reef_lab.gateway import Reply, StreamReply

TAG_PREFIX = "x-reef-tag-"


def json_body():
    data = request.get_data(cache=False)
    if not data:
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None


def tags() -> dict[str, str]:
    return {k[len(TAG_PREFIX):].lower(): v for k, v in request.headers.items() if k.lower().startswith(TAG_PREFIX)}


def scenario() -> str | None:
    return request.headers.get("x-reef-scenario")


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(obj), status=status, mimetype="application/json", headers=headers)


def to_response(reply: Reply | StreamReply) -> Response:
    if isinstance(reply, StreamReply):
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **reply.headers}
        return Response(reply.events, status=200, mimetype="text/event-stream", headers=headers)
    return Response(reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers)
