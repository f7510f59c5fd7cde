"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

Every failure the API can meet ends here, so bad input never becomes a bare 500 or an HTML page.
"""

import logging
import re

from litestar import Request, Response
from litestar.exceptions import (
    ClientException,
    HTTPException,
    InternalServerException,
    ValidationException,
)

from spyglass.core.engine.engine_loop import EngineDeadError
from spyglass.core.engine.sampling_params import InvalidRequestError

BODY_CUT_SHORT = "client disconnected prematurely"
"""What Litestar raises (as a 500) when the client leaves before its request body has arrived."""

log = logging.getLogger("spyglass.api")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error the API answers with ``status_code`` and an OpenAI error body."""

    def __init__(
        self,
        status_code: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(
    status_code: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    """The JSON body of an error response (also the payload of a mid-stream ``data: {"error": ...}`` event)."""
    error_type = _TYPES.get(
        status_code, "invalid_request_error" if status_code < 500 else "internal_error"
    )
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _respond(status_code: int, message: str, param=None, code=None, headers=None) -> Response:
    return Response(
        error_body(status_code, message, param, code), status_code=status_code, headers=headers
    )


def _api_error(_: Request, exc: APIError) -> Response:
    return _respond(exc.status_code, exc.message, exc.param, exc.code, exc.headers)


def _invalid_request(_: Request, exc: InvalidRequestError) -> Response:
    return _respond(400, str(exc), exc.param)


def _engine_dead(_: Request, exc: EngineDeadError) -> Response:
    return _respond(503, str(exc), code="engine_unavailable")


def _validation(_: Request, exc: ValidationException) -> Response:
    # Litestar lists msgspec's findings in ``extra``; the first one names the offending field.
    param, message = None, exc.detail
    if isinstance(exc.extra, list) and exc.extra and isinstance(exc.extra[0], dict):
        first = exc.extra[0]
        message = first.get("message") or message
        key = first.get("key")
        param = key.removeprefix("$.") if isinstance(key, str) and key != "data" else None
        missing = re.search(r"missing required field `([^`]+)`", str(message))
        param = missing.group(1) if missing else param
    if not message or message == "Validation failed for POST":
        message = "the request body is not valid"
    return _respond(400, str(message), param)


def _http(_: Request, exc: HTTPException) -> Response:
    headers = dict(exc.headers or {})
    message = exc.detail
    if type(exc) is InternalServerException and message == BODY_CUT_SHORT:
        # The client left before its body arrived: no server error, and nobody reads the answer.
        return _respond(499, "the client closed the connection", code="client_disconnected")
    if exc.status_code == 413:
        message = "the request body is too large"
    elif type(exc) is ClientException and exc.status_code == 400:
        # Litestar raises a bare ClientException when msgspec cannot decode the body at all.
        message = f"the request body is not valid JSON: {message}"
    return _respond(exc.status_code, str(message), headers=headers or None)


def _too_deep(_: Request, exc: RecursionError) -> Response:
    return _respond(400, "the request body is nested too deeply")


def _internal(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error serving %s %s", request.method, request.url.path)
    return _respond(500, f"internal error: {type(exc).__name__}")


EXCEPTION_HANDLERS: dict = {
    APIError: _api_error,
    InvalidRequestError: _invalid_request,
    EngineDeadError: _engine_dead,
    ValidationException: _validation,
    HTTPException: _http,
    RecursionError: _too_deep,
    Exception: _internal,
}
