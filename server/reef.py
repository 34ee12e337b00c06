"""reef_lab's own resources: scenarios, records, status (reports are a hot route: server/hot.py)."""

from __future__ import annotations

from flask import Blueprint, g, request

from reef_lab.errors import BadRequest
from server.common import json_body, json_response, scenario

bp = Blueprint("reef", __name__, url_prefix="/reef")


@bp.get("/scenarios")
def list_scenarios():
    return json_response({"scenarios": [g.gateway.scenario_info(s.name) for s in g.gateway.scenarios.list()]})


@bp.post("/scenarios")
def create_scenario():
    return json_response(g.gateway.create_scenario(json_body()), 201)


@bp.get("/scenarios/<name>")
def get_scenario(name: str):
    return json_response(g.gateway.scenario_info(name))


@bp.delete("/scenarios/<name>")
def delete_scenario(name: str):
    return json_response(g.gateway.delete_scenario(name))


def _int_arg(key: str, default: int) -> int:
    v = request.args.get(key)
    if v is None:
        return default
    try:
        return int(v)
    except ValueError:
        raise BadRequest(f"query parameter '{key}' must be an integer, got {v!r}") from None


@bp.get("/scenarios/<name>/records")
def list_records(name: str):
    return json_response(g.gateway.list_records(name, request.args.get("kind"), _int_arg("limit", 50),
                                                request.args.get("after")))


@bp.get("/scenarios/<name>/records/<record_id>")
def get_record(name: str, record_id: str):
    return json_response(g.gateway.get_record(name, record_id))


@bp.post("/records/batch")
def import_records():
    status, body = g.gateway.import_records(json_body(), scenario())
    return json_response(body, status)


@bp.get("/status")
def status():
    return json_response(g.gateway.status())
