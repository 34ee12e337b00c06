"""Request helpers shared by the Flask blueprints, the hot-route middleware and relay workers.

Every request passes `admit` before its body is read (auth: which token, so which grant; browser origin, media
type, declared size) and
reads its body through `read_body` (size bound, chunked bodies too) and `parse_json` (nesting bound), so a
request is judged the same in every worker and on every route.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

import orjson
from flask import Response, g, request

from reef_lab.errors import BadRequest, Forbidden, PayloadTooLarge, ReefError, UnsupportedMediaType
from reef_lab.gateway.gateway import Reply, StreamReply
from reef_lab.tenants import Grant, Tenants, digest

TAG_PREFIX = "x-reef-tag-"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REPORT_PATH, IMPORT_PATH = "/reef/report", "/reef/records/batch"


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold. Defaults fit chat traffic: long conversations and tool schemas pass, a body
    that would cost the server hundreds of MB to parse and record does not."""

    body_bytes: int = 10 << 20  # inference and every other JSON body
    report_bytes: int = 1 << 20  # POST /reef/report
    import_bytes: int = 32 << 20  # POST /reef/records/batch
    json_depth: int = 64  # nesting of objects and arrays

    def for_path(self, path: str) -> int:
        return self.report_bytes if path == REPORT_PATH else self.import_bytes if path == IMPORT_PATH \
            else self.body_bytes


DEFAULT_LIMITS = RequestLimits()


def limits_from(cfg) -> RequestLimits:
    """The limits a ServeConfig sets."""
    return RequestLimits(body_bytes=int(cfg.max_body_mb * (1 << 20)), report_bytes=int(cfg.max_report_kb * 1024),
                  import_bytes=int(cfg.max_import_mb * (1 << 20)), json_depth=cfg.max_json_depth)


def _mb(n: int) -> str:
    return f"{n / (1 << 20):g} MB" if n >= 1 << 20 else f"{n / 1024:g} KB"


def admit(environ, tenants: Tenants, limits: RequestLimits) -> Grant:
    """The caller's grant (reef_lab/tenants.py), once the request passed what is judged before its body is read: a
    missing or unknown token (401); with auth off, a browser page of another site (403, so no web page can drive a
    loopback server); a body that is not JSON (415); a declared length over the route's limit (413)."""
    path = environ.get("PATH_INFO", "")
    grant = tenants.identify(environ.get("HTTP_AUTHORIZATION", ""), environ.get("HTTP_X_API_KEY", ""))
    if not tenants.enabled:
        check_same_origin(environ)
    length = environ.get("CONTENT_LENGTH") or ""
    if has_body(environ):
        media = environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()
        if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
            raise UnsupportedMediaType(f"the request body must be JSON sent as 'Content-Type: application/json', "
                                       f"got {media or 'no Content-Type'!r}")
        if length and not length.isdigit():
            raise BadRequest(f"Content-Length {length!r} is not a number")
        limit = limits.for_path(path)
        if length and int(length) > limit:
            raise PayloadTooLarge(f"the request body is {int(length)} bytes; {path} takes at most {_mb(limit)} "
                                  "(the server's --max-*-mb / --max-report-kb settings)")
    return grant


def has_body(environ) -> bool:
    return (environ.get("CONTENT_LENGTH") or "0") != "0" or "chunked" in environ.get("HTTP_TRANSFER_ENCODING",
                                                                                    "").lower()


def check_same_origin(environ) -> None:
    """With no token required, only non-browser clients and pages of this server itself may call it."""
    site = environ.get("HTTP_SEC_FETCH_SITE")
    origin = environ.get("HTTP_ORIGIN")
    cross = site in ("cross-site", "same-site")
    if not cross and origin is not None:
        cross = origin == "null" or urllib.parse.urlsplit(origin).netloc.lower() != environ.get("HTTP_HOST",
                                                                                            "").lower()
    if cross:
        raise Forbidden(f"a browser page from {origin or 'another site'} may not call this server while it runs "
                        "without auth; set REEF_TOKEN on the server and send 'Authorization: Bearer <token>'")


def read_body(environ, limit: int) -> bytes:
    """The whole request body, at most `limit` bytes (413 beyond; `admit` refused a declared length already)."""
    length = environ.get("CONTENT_LENGTH")
    if length:
        if not length.isdigit():
            raise BadRequest(f"Content-Length {length!r} is not a number")
        return environ["wsgi.input"].read(int(length))
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and no terminated stream: no body
    data = environ["wsgi.input"].read(limit + 1)  # a chunked body: read to its end, or just past the limit
    if len(data) > limit:
        raise PayloadTooLarge(f"the request body is over {_mb(limit)}, the most {environ.get('PATH_INFO')} takes")
    return data


def parse_json(data: bytes, max_depth: int = DEFAULT_LIMITS.json_depth):
    if not data:
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    # Nesting can be no deeper than the count of brackets: most bodies are judged by that count alone (in C).
    if data.count(b"{") + data.count(b"[") > max_depth and json_depth(obj, max_depth) > max_depth:
        raise BadRequest(f"the request body nests objects and arrays deeper than {max_depth} levels")
    return obj


def json_depth(obj, stop: int) -> int:
    """How deeply `obj` nests containers, counted up to just past `stop`."""
    if not isinstance(obj, (dict, list)):
        return 0
    deepest, todo = 0, [(obj, 1)]
    while todo:
        o, d = todo.pop()
        if d > deepest:
            deepest = d
            if deepest > stop:
                break
        items = o.values() if isinstance(o, dict) else o
        todo.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return deepest


def client_headers(environ, tenants: Tenants) -> dict[str, str]:
    """The request's headers with lower-case names, for the relay to pass on by its rules
    (reef_lab/engines/headers.py), less a credential header that holds one of reef_lab's own tokens."""
    out = {k[5:].lower().replace("_", "-"): v for k, v in environ.items()
           if k.startswith("HTTP_") and isinstance(v, str)}
    for name in ("authorization", "x-api-key"):
        if name in out and tenants.enabled and tenants.find(out[name]) is not None:
            del out[name]
    return out


def error_body(path: str, err: ReefError) -> bytes:
    """The error in the wire format of the API the client called (`detail` too, as Reef's clients read it)."""
    if path.startswith("/v1/messages"):
        return orjson.dumps({"type": "error", "error": {"type": err.type, "message": err.message}})
    body = {"error": {"message": err.message, "type": err.type, "param": None, "code": None}}
    if path.startswith("/reef/"):
        body["detail"] = err.message
    return orjson.dumps(body)


def json_body():
    """The request's JSON body within the app's limits (`admit` ran in before_request)."""
    limits: RequestLimits = g.limits
    return parse_json(read_body(request.environ, limits.for_path(request.path)), limits.json_depth)


def tags() -> dict[str, str]:
    return {k[len(TAG_PREFIX):].lower(): v for k, v in request.headers.items() if k.lower().startswith(TAG_PREFIX)}


def scenario() -> str | None:
    return request.headers.get("x-reef-scenario")


def tenants_of(tokens) -> Tenants:
    """The app's tenants from what create_app was given: a Tenants, or a list of admin tokens (REEF_TOKEN's
    meaning), or None (auth off)."""
    return tokens if isinstance(tokens, Tenants) else Tenants.load([t for t in tokens or [] if t])


def legacy_tokens_warning(env_tokens: list[str], tenants: Tenants) -> str | None:
    """The start log's warning when REEF_TOKEN gives tokens (documented as admins of every scenario, so each one
    is): how many, what that lets them do, and the scoped alternative. It never names a token."""
    admins = {h for h in map(digest, env_tokens) if tenants.grants[h].everywhere}
    if not admins:
        return None
    n = len(admins)
    return (f"REEF_TOKEN gives {n} token{'s' if n != 1 else ''}, each an admin of every scenario: it may read, "
            "change and delete every scenario's records, releases and harness, and sees the deployment (data dir, "
            "engine). For tokens scoped to scenarios and roles start with --tokens-file tokens.yaml, making each "
            "with 'reef-lab token add --file tokens.yaml --role agent --scenario NAME' (docs/api.md#tokens)")


def json_response(obj, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(obj), status=status, mimetype="application/json", headers=headers)


def to_response(reply: Reply | StreamReply) -> Response:
    if isinstance(reply, StreamReply):
        return Response(reply.events, status=200, mimetype="text/event-stream", headers={**SSE_HEADERS,
                                                                                        **reply.headers})
    return Response(reply.body, status=reply.status, content_type=reply.content_type, headers=reply.headers)
