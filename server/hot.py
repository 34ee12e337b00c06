"""The hot routes (inference and reports) as WSGI middleware in front of the Flask app.

These four routes carry nearly all traffic. Served through Flask's request machinery (contexts, proxies,
signals, Response objects) they ran at half the rate of the same gateway calls made from plain WSGI on this
machine (scripts/bench/bench_gateway.py), so they are translated here, directly from the WSGI environ, and installed
the way Flask documents middleware (`app.wsgi_app = HotRoutes(app.wsgi_app, ...)`). Every other route, and
every error page, stays with Flask. Auth, error bodies and tag rules are the shared ones in server/common.py.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

import orjson

from reef_lab.gateway import unanswered
from reef_lab.wire import dialects
from reef_lab.errors import ReefError
from reef_lab.gateway.gateway import Gateway, StreamReply
from reef_lab.tenants import Tenants
from server.access import HOT_ROUTES
from server.common import (DEFAULT_LIMITS, SSE_HEADERS, RequestLimits, admit, client_headers, error_body, parse_json,
                           read_body)

log = logging.getLogger("reef_lab.server")

INFERENCE = {"/v1/chat/completions": dialects.OPENAI_CHAT, "/v1/responses": dialects.OPENAI_RESPONSES,
             "/v1/messages": dialects.ANTHROPIC}
REPORT = "/reef/report"
_TAG = "HTTP_X_REEF_TAG_"
_STATUS = {s.value: f"{s.value} {s.phrase}" for s in HTTPStatus}


def _status(code: int) -> str:
    return _STATUS.get(code) or f"{code} Unknown"


def _tags(environ) -> dict[str, str]:
    # WSGI spells header x-reef-tag-user-id as HTTP_X_REEF_TAG_USER_ID; tags keep the header's dashes.
    return {k[len(_TAG):].lower().replace("_", "-"): v for k, v in environ.items() if k.startswith(_TAG)}


def whole_bodies(app):
    """Hand granian a list for every response that has a Content-Length (all but streams).

    granian sends a list in one call, but pulls any other iterable item by item from its own threads, each pull
    taking the GIL again; Flask returns such an iterable even for a body it already holds. Streams (no
    Content-Length) pass through untouched.
    """
    def wrapped(environ, start_response):
        sized = False

        def start(status, headers, exc_info=None):
            nonlocal sized
            sized = any(k.lower() == "content-length" for k, _ in headers)
            return start_response(status, headers, exc_info)
        rv = app(environ, start)
        if not sized or isinstance(rv, list):
            return rv
        try:
            return [b"".join(rv)]
        finally:
            if hasattr(rv, "close"):
                rv.close()
    return wrapped


class HotRoutes:
    """`local(environ, dialect)`, when given, decides which hot requests are served here; the rest go on to
    `flask_wsgi` (a relay worker passes them to its primary, see server/workers.py)."""

    def __init__(self, flask_wsgi, gateway: Gateway, tenants: Tenants, local=None,
                 limits: RequestLimits = DEFAULT_LIMITS):
        self.flask_wsgi, self.gateway, self.tenants, self.local = flask_wsgi, gateway, tenants, local
        self.limits = limits

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        dialect = INFERENCE.get(path)
        if dialect is None and path != REPORT or self.local is not None and not self.local(environ, dialect):
            return self.flask_wsgi(environ, start_response)
        reached = False  # whether the gateway took the request (it records and logs its own refusals)
        try:
            if environ.get("REQUEST_METHOD") != "POST":
                err = ReefError(f"method {environ.get('REQUEST_METHOD')} is not allowed on {path}; use POST",
                                status=405)
                err.type = "invalid_request_error"
                raise err
            grant = admit(environ, self.tenants, self.limits)
            scenario, tags = environ.get("HTTP_X_REEF_SCENARIO"), _tags(environ)
            grant.check(HOT_ROUTES[path], scenario)  # before the body is read: nothing of it reaches the scenario
            body = parse_json(read_body(environ, self.limits.for_path(path)), self.limits.json_depth)
            reached = True
            if dialect is None:  # an agent or reader token reports on its own receipts only
                created, rid = self.gateway.report(scenario, body, tags, caller=grant.id,
                                                   only_own=not grant.has("admin"), scoped_ids=not grant.everywhere)
                out = orjson.dumps({"agent_record_id": rid, "scenario": scenario, "request_type": "report",
                                    "id": rid, "created": created})
                return self._send(start_response, 200, out, "application/json", {"x-reef-agent-record-id": rid})
            reply = self.gateway.infer(dialect, body, scenario, tags, client_headers(environ, self.tenants),
                                       caller=grant.id, creator=None if grant.everywhere else grant.id)
        except ReefError as e:
            if not reached and dialect is not None:  # [episodes hook] refused before the gateway: a line, no record
                unanswered.log_unrecorded(dialect, "refused before the gateway", e)
            return self._send(start_response, e.status, error_body(path, e), "application/json", e.headers)
        except Exception as e:  # a bug, not the client's fault: logged, answered 500, serving goes on
            log.exception("unhandled error on POST %s", path)
            err = ReefError(f"internal error: {type(e).__name__}: {e}")
            return self._send(start_response, 500, error_body(path, err), "application/json", {})
        if isinstance(reply, StreamReply):
            headers = [("Content-Type", "text/event-stream"), *SSE_HEADERS.items(), *reply.headers.items()]
            on_hangup = environ.get("reef.on_hangup")  # server/httpd.py: calls back when the client goes
            if on_hangup is not None and reply.cancel is not None:
                on_hangup(reply.cancel)
            start_response("200 OK", headers)
            return reply.events
        return self._send(start_response, reply.status, reply.body, reply.content_type, reply.headers)

    @staticmethod
    def _send(start_response, code: int, body: bytes, content_type: str, headers: dict):
        start_response(_status(code), [("Content-Type", content_type), ("Content-Length", str(len(body))),
                                       *headers.items()])
        return [body]
