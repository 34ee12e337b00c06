"""The providers' APIs besides inference itself (served by server/hot.py): token counting and model lists."""

from __future__ import annotations

from flask import Blueprint, g, request

from server.common import client_headers, json_body, to_response

bp = Blueprint("inference", __name__)


@bp.post("/v1/messages/count_tokens")
def count_tokens():
    return to_response(g.gateway.count_tokens(json_body(), client_headers(request.environ, g.tenants)))


@bp.get("/v1/models")
def models():
    return to_response(g.gateway.models())
