"""Checks on a request body before any handler sees it: media type, size, nesting, strict types, refused fields.

Litestar converts bodies leniently (``"10"`` becomes 10, ``"true"`` becomes True); the API must
not guess, so `json_body_guard` decodes each body strictly first and answers a precise 4xx.
"""

import difflib
import re

import msgspec
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from spyglass.core.api.errors import APIError

_JSON_TYPES = ("application/json",)
# The field msgspec names: missing, or where the bad value is (``at `$.stop[2]```), or whose key
# is (``at `key` in `$.metadata```); its top-level name, and its dotted path of object fields.
_FIELD = re.compile(
    r"missing required field `([^`]+)`|(?:at|in) `\$\.(([A-Za-z_][A-Za-z0-9_]*)[A-Za-z0-9_.]*)"
)
# A top-level field the body's type does not declare (a nested one is named by where it is).
_UNKNOWN = re.compile(r"^Object contains unknown field `([^`]+)`$")
_MAX_NAME = 128


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type in _JSON_TYPES or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def decode_body(body: bytes, body_type: type[msgspec.Struct]) -> msgspec.Struct:
    """``body`` strictly decoded as ``body_type``; an `APIError` (400) naming the field otherwise
    (a field the type does not declare included: request types forbid unknown fields)."""
    if not body.strip():
        raise APIError(400, "the request body is empty; send a JSON object")
    try:
        return msgspec.json.decode(body, type=body_type)
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply") from None
    except msgspec.ValidationError as error:
        unknown = _UNKNOWN.match(str(error))
        if unknown:
            # OpenAI's wording: a field this server does not know is refused, never ignored (its
            # name cut short: a client can make one up of any length).
            name = unknown[1][:_MAX_NAME]
            raise APIError(
                400,
                f"Unrecognized request argument supplied: {name}{_did_you_mean(name, body_type)}",
                name,
                "unknown_parameter",
            ) from None
        match = _FIELD.search(str(error))
        missing, path, top = match.groups() if match else (None, None, None)
        param = missing or top
        unsupported = getattr(body_type, "unsupported", ())
        # A refused field, or a refused setting inside one (``stream_options.include_obfuscation``).
        refused = next((name for name in (path, top) if name in unsupported), None)
        if refused is not None:
            raise APIError(
                400, f"`{refused}` is not supported by this server", param, "unsupported_parameter"
            ) from None
        raise APIError(400, str(error), param) from None
    except msgspec.DecodeError as error:
        raise APIError(400, f"the request body is not valid JSON: {error}") from None


def _did_you_mean(name: str, body_type: type[msgspec.Struct]) -> str:
    """`` (did you mean `max_tokens`?)`` for a near miss of one of ``body_type``'s fields, else ""."""
    fields = [field.encode_name for field in msgspec.structs.fields(body_type)]
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.8)
    return f" (did you mean `{close[0]}`?)" if close else ""


async def json_body_guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """For handlers with ``opt={"body": StructType}``: demand ``application/json`` (415) and a strictly valid body.

    Requiring the JSON media type also means a web page cannot post to a keyless local server
    without a CORS preflight (``text/plain`` is a "simple" request that browsers send unasked).
    """
    body_type = handler.opt.get("body")
    if body_type is None:
        return
    if not _is_json(connection.headers.get("content-type", "")):
        raise APIError(
            415,
            "the request body must be JSON: send `Content-Type: application/json`",
            code="unsupported_media_type",
        )
    decode_body(await connection.body(), body_type)  # type: ignore[attr-defined]
