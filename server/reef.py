"""reef_lab's own resources: scenarios, records, status (reports are a hot route: server/hot.py).

Each route's role is in server/access.py, checked before the view runs (`g.grant`, reef_lab/tenants.py); the views
here check only what the table leaves to them (`view`): a scenario named in a body, each imported record's, a stored
change request's, and lists cut to the token's scenarios. Answers on releases, candidates and change requests go
out through `gateway.for_grant`: no server path for a token of some scenarios only."""

from __future__ import annotations

from flask import Blueprint, Response, g, request

from reef_lab.errors import BadRequest
from server.common import has_body, json_body, json_response, scenario

bp = Blueprint("reef", __name__, url_prefix="/reef")


@bp.get("/scenarios")
def list_scenarios():
    return json_response({"scenarios": [g.gateway.scenario_info(s.name) for s in g.gateway.scenarios.list()
                                        if g.grant.covers(s.name)]})


@bp.post("/scenarios")
def create_scenario():
    body = json_body()
    name = body.get("name") if isinstance(body, dict) else None
    g.grant.check("admin", name if isinstance(name, str) else None)  # a name of another type: the gateway's 400
    return json_response(g.gateway.create_scenario(body, creator=_creator()), 201)


@bp.get("/scenarios/<name>")
def get_scenario(name: str):
    return json_response(g.gateway.scenario_info(name))


@bp.delete("/scenarios/<name>")
def delete_scenario(name: str):
    return json_response(g.gateway.delete_scenario(name))


def _creator() -> str | None:
    """The token a scenario made by this request counts against: one of some scenarios only (ScenarioLimits)."""
    return None if g.grant.everywhere else g.grant.id


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
                                                request.args.get("after"), request.args.get("session")))


@bp.get("/scenarios/<name>/records/<record_id>")
def get_record(name: str, record_id: str):
    return json_response(g.gateway.get_record(name, record_id))


@bp.post("/records/batch")
def import_records():
    status, body = g.gateway.import_records(json_body(), scenario(), g.grant)
    return json_response(body, status)


@bp.get("/status")
def status():
    return json_response(g.gateway.status(g.grant))


@bp.post("/train")
def train():
    """Train one round now (scenarios in mode manual or hybrid): x-reef-scenario header or {"scenario": ...};
    with {"text": ..., "session"?, "release_id"?} a change request on a harness scenario (GET /reef/requests/{id})."""
    body = json_body() if has_body(request.environ) else {}
    name = scenario() or (body.get("scenario") if isinstance(body, dict) else None)
    g.grant.check("admin", name if isinstance(name, str) else None)
    return json_response(g.gateway.train(name, body), 202)


@bp.get("/requests/<request_id>")
def get_request(request_id: str):
    """A change request's state: queued, proposing, evaluating, pending_review, released or rejected (with why);
    404 when its scenario is gone (deleted, or created again since) or not the token's."""
    return json_response(g.gateway.for_grant(g.gateway.get_request(request_id, g.grant), g.grant))


@bp.get("/scenarios/<name>/requests")
def list_requests(name: str):
    since = g.gateway.scenarios.get(name).since
    return json_response(g.gateway.for_grant(
        {"scenario": name, "requests": g.gateway.requests.list(name, since)}, g.grant))


@bp.get("/scenarios/<name>/releases")
def releases(name: str):
    return json_response(g.gateway.for_grant(g.gateway.list_releases(name), g.grant))


@bp.post("/scenarios/<name>/rollback")
def rollback(name: str):
    return json_response(g.gateway.for_grant(g.gateway.rollback(name, json_body()), g.grant))


@bp.post("/scenarios/<name>/promote")
def promote(name: str):
    return json_response(g.gateway.for_grant(g.gateway.promote(name, json_body()), g.grant), 201)


@bp.get("/harness")
def get_harness():
    """The serving harness of the scenario in x-reef-scenario (or ?release_id=vN): {release_id, files}."""
    return json_response(g.gateway.get_harness(scenario(), request.args.get("release_id")))


@bp.post("/scenarios/<name>/harness")
def publish_harness(name: str):
    """Publish a harness release {files: {path: text}} by hand (a seed harness, or an edit)."""
    release = g.gateway.publish_harness(name, json_body(), creator=_creator())
    return json_response(g.gateway.for_grant(release, g.grant), 201)


INSTALL_ARGS = {"adapter", "release_id", "scenario", "base_url", "model"}


@bp.get("/harness/install")
def harness_install():
    """A POSIX sh script installing the scenario's harness release into a coding agent (harness/install/script.py):
    ?adapter=claude|codex|opencode|pi|files[&release_id=vN][&base_url=...][&model=...]; scenario from
    x-reef-scenario or ?scenario=."""
    from reef_lab.harness.install.script import install_script

    unknown = sorted(set(request.args) - INSTALL_ARGS)
    if unknown:
        raise BadRequest(f"unknown query parameter(s) {unknown}; known: {sorted(INSTALL_ARGS)}")
    name = scenario() or request.args.get("scenario")
    harness, tree = g.gateway.harness_release(name, request.args.get("release_id"))
    text = install_script(harness, tree, request.args.get("adapter"), request.args.get("base_url") or request.host_url,
                          request.args.get("model") or g.gateway.engine.model_name)
    return Response(text, mimetype="text/x-shellscript", headers={"x-reef-release-id": harness["release_id"]})


# [episodes hooks] an agent session's calls in turn order (reef_lab/gateway/episodes.py, docs/episodes.md)
@bp.get("/episodes/<episode>")
def get_episode(episode: str):
    """The episode's calls in the scenario named by x-reef-scenario (or ?scenario=): those this token made, or with
    ?caller=<token id> another token's (an episode is its token's own)."""
    return json_response(g.gateway.get_episode(scenario() or request.args.get("scenario"), episode,
                                               request.args.get("caller", g.grant.id)))


@bp.get("/scenarios/<name>/episodes/<episode>")
def get_scenario_episode(name: str, episode: str):
    return json_response(g.gateway.get_episode(name, episode, request.args.get("caller", g.grant.id)))
