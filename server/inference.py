"""The providers' APIs besides inference itself (served by server/hot.py): token counting and model lists."""

from __future__ import annotations

from flask import Blueprint, g, request

from server.common import json_body, to_response

bp = Blueprint("inference", __name__)

_FORWARDED = ("anthropic-version", "anthropic-beta")


@bp.post("/v1/messages/count_tokens")
def count_tokens():
    headers = {h: request.headers[h] for h in _FORWARDED if h in request.headers}
    return to_response(g.gateway.count_tokens(json_body(), headers))


@bp.get("/v1/models")
def models():
    return to_response(g.gateway.models())
