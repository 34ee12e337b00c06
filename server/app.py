"""The Flask app: HTTP in, gateway calls, HTTP out. Nothing else lives here.

`create_app(gateway, tokens)` builds the app around a ready `reef_lab.gateway.gateway.Gateway`; `scripts/serve.py` runs
it under granian. Routes: the hot ones (inference, reports) in server/hot.py, installed as the app's WSGI
middleware; the rest of the providers' APIs in server/inference.py and reef_lab's resources in server/reef.py.
Every route but /healthz needs a token when tokens are configured, with the role and scenario server/access.py
names for it (reef_lab/tenants.py).
"""

from __future__ import annotations

import logging

import orjson

from flask import Flask, Response, g, request

from reef_lab.errors import ReefError
from reef_lab.gateway.gateway import Gateway
from reef_lab.tenants import Tenants
from server.access import check_route
from server.common import DEFAULT_LIMITS, RequestLimits, admit, error_body, tenants_of
from server.hot import HotRoutes, whole_bodies
from server.inference import bp as inference_bp
from server.reef import bp as reef_bp

log = logging.getLogger("reef_lab.server")
LEARNER_PATHS = ("/healthz", "/reef/status")  # what a learner service answers (its learners' state)


def create_app(gateway: Gateway, tokens: Tenants | list[str] | None = None,
               limits: RequestLimits = DEFAULT_LIMITS) -> Flask:
    """`tokens`: the deployment's Tenants, or a list of admin tokens of every scenario (REEF_TOKEN's meaning); none:
    auth off."""
    app = Flask("reef_lab")
    app.config["GATEWAY"] = gateway
    tenants = tenants_of(tokens)

    learner_only = gateway.service == "learner"

    @app.before_request
    def authenticate():
        g.gateway, g.limits, g.tenants = gateway, limits, tenants
        if learner_only and request.path not in LEARNER_PATHS:
            err = ReefError(f"this process is a learner service (--service learner): {request.path} is served by "
                            "the deployment's gateways", status=404)
            err.type = "not_found_error"
            raise err
        if request.path != "/healthz":
            g.grant = admit(request.environ, tenants, limits)
            check_route(g.grant)

    @app.errorhandler(ReefError)
    def reef_error(err: ReefError):
        return Response(error_body(request.path, err), status=err.status, mimetype="application/json",
                        headers=err.headers)

    @app.errorhandler(404)
    def not_found(_):
        err = ReefError(f"no route for {request.method} {request.path}", status=404)
        err.type = "not_found_error"
        return Response(error_body(request.path, err), status=404, mimetype="application/json")

    @app.errorhandler(405)
    def not_allowed(_):
        err = ReefError(f"method {request.method} is not allowed on {request.path}", status=405)
        err.type = "invalid_request_error"
        return Response(error_body(request.path, err), status=405, mimetype="application/json")

    @app.errorhandler(Exception)
    def internal(e: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        err = ReefError(f"internal error: {type(e).__name__}: {e}")
        return Response(error_body(request.path, err), status=500, mimetype="application/json")

    @app.get("/healthz")
    def healthz():
        problem = gateway.state.check() if gateway.state is not None else None
        if problem:  # a shared deployment's database is away: no durable write can be acknowledged here now
            return Response(orjson.dumps({"ok": False, "error": problem}), status=503, mimetype="application/json",
                            headers={"retry-after": "1"})
        return Response(b'{"ok":true}', mimetype="application/json")

    app.register_blueprint(inference_bp)
    app.register_blueprint(reef_bp)
    app.wsgi_app = whole_bodies(app.wsgi_app) if learner_only else \
        HotRoutes(whole_bodies(app.wsgi_app), gateway, tenants, limits=limits)
    return app
