"""Errors that carry an HTTP status and a message that says what to fix.

The SDK raises these; the server turns them into the error body of the dialect the client speaks.
"""


class ReefError(Exception):
    status = 500
    type = "server_error"
    headers: dict[str, str] = {}  # sent with the error answer (e.g. retry-after)

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadRequest(ReefError):
    status, type = 400, "invalid_request_error"


class Unauthorized(ReefError):
    status, type = 401, "authentication_error"


class NotFound(ReefError):
    status, type = 404, "not_found_error"


class Conflict(ReefError):
    status, type = 409, "conflict_error"


class UpstreamError(ReefError):
    """The upstream provider failed: unreachable (502), timed out (504) or answered 5xx (502)."""

    status, type = 502, "upstream_error"


class StoreUnavailable(ReefError):
    status, type = 503, "store_unavailable"


class Forbidden(ReefError):
    status, type = 403, "permission_error"


class RequestTimeout(ReefError):
    status, type = 408, "request_timeout"


class PayloadTooLarge(ReefError):
    status, type = 413, "request_too_large"


class UnsupportedMediaType(ReefError):
    status, type = 415, "invalid_request_error"


class EngineUnavailable(ReefError):
    """The engine is down or restarting; the client may retry after `retry-after` seconds."""

    status, type = 503, "engine_unavailable"
    headers = {"retry-after": "5"}
