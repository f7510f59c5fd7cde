"""Structured logs with structlog: JSON lines when stdout is not a terminal, coloured console otherwise.

Spyglass's own loggers are structlog loggers wrapped around the standard library's, so an
embedding program that never calls `setup_logging` keeps full control through ``logging``.
`setup_logging` installs one handler that renders structlog events and plain ``logging``
records (uvicorn's, Litestar's, the engine's) alike, so every entry point (serve, generate,
bench) writes one schema: ``timestamp``, ``level``, ``logger``, ``event`` and the event's fields.
Request-related lines carry ``req_id``, ``request_id``, ``trace_id`` and ``span_id``
(`request_fields`), so a log line leads to its trace and to the access-log line.
"""

import logging
import sys

import structlog

from spyglass.telemetry.request_context import info_of
from spyglass.telemetry.tracing import trace_ids

# Shared by structlog events and foreign (plain logging) records before rendering.
_PRE_CHAIN = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A structlog logger that goes through ``logging.getLogger(name)`` (levels and handlers apply)."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            *_PRE_CHAIN,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def setup_logging(
    level: int | str = logging.INFO, json: bool | None = None, stream=None
) -> logging.Handler:
    """Render every log record to ``stream`` (stdout): JSON lines unless it is a terminal (or ``json`` says).

    Replaces the root logger's handlers; returns the handler installed.
    """
    stream = stream or sys.stdout
    if json is None:
        json = not stream.isatty()
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=_PRE_CHAIN,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            *([structlog.processors.format_exc_info] if json else []),
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # Python warnings become log records too, in the same schema
    return handler


def request_fields(request) -> dict[str, str]:
    """``req_id``, ``request_id``, ``trace_id`` and ``span_id`` for a request's log lines.

    ``req_id`` is the engine's id (the response id the client sees, e.g. ``chatcmpl-...``);
    ``request_id`` the HTTP request's ``X-Request-Id`` (the client's, or one the server made), as
    in the access-log line; it and the trace ids are empty for requests that did not come over HTTP.
    """
    info = info_of(request)
    return {
        "req_id": request.req_id,
        "request_id": info.request_id if info else "",
        **trace_ids(request),
    }
