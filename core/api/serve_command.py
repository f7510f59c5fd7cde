"""``spyglass serve [MODEL]``: the OpenAI-compatible HTTP server."""

import logging
import os
import signal

import uvicorn

from spyglass.core.api.app import begin_shutdown, create_app
from spyglass.core.api.context import ServerOptions
from spyglass.core.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.llm import parse_bytes
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.cli_options import add_telemetry_arguments, settings_from_args
from spyglass.telemetry.http import TelemetryMiddleware


def add_parser(subparsers) -> None:
    """Register the command."""
    parser = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    parser.add_argument(
        "model_positional", nargs="?", metavar="MODEL", help="GGUF file or HF directory (overrides --model)"
    )
    defaults = ServerOptions()
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=defaults.host)
    group.add_argument("--port", type=int, default=defaults.port)
    group.add_argument(
        "--api-key", default=os.environ.get("SPYGLASS_API_KEY"), help="require this bearer key (env SPYGLASS_API_KEY)"
    )
    group.add_argument("--metrics-require-key", action="store_true", help="put /metrics behind the API key too")
    group.add_argument("--max-body-bytes", default="4MiB", help="largest request body; bigger ones get a 413")
    group.add_argument("--max-queued-requests", type=int, default=defaults.max_queued_requests,
                       help="answer 429 while this many requests wait in the engine queue")
    group.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout,
                       help="seconds in-flight requests get to finish after SIGTERM before they are aborted")
    group.add_argument("--served-model-name", default=None, help="the model name clients use (default: the model's)")
    group.add_argument("--disable-access-log", action="store_true", help="do not log every HTTP request")
    add_engine_arguments(parser)
    add_telemetry_arguments(parser)
    parser.set_defaults(run=run)


class _Server(uvicorn.Server):
    """uvicorn, plus: a signal first stops admission and drains the engine, and SIGTERM ends with exit code 0."""

    def __init__(self, config: uvicorn.Config, app, shutdown_timeout: float):
        super().__init__(config)
        self.app = app
        self.shutdown_timeout = shutdown_timeout

    def handle_exit(self, sig, frame) -> None:
        begin_shutdown(self.app, self.shutdown_timeout)
        super().handle_exit(sig, frame)
        # uvicorn re-raises captured signals after shutdown; a drained SIGTERM is a clean exit.
        if sig == signal.SIGTERM:
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


def run(args) -> int:
    """Build the app and serve it until a signal arrives."""
    if args.model_positional:
        args.model = args.model_positional
    options = ServerOptions(
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        metrics_require_key=args.metrics_require_key,
        max_body_bytes=parse_bytes(args.max_body_bytes),
        max_queued_requests=args.max_queued_requests,
        shutdown_timeout=args.shutdown_timeout,
        served_model_name=args.served_model_name,
    )
    telemetry_settings.configure(settings_from_args(args))
    app = create_app(engine_config_from_args(args), options)
    config = uvicorn.Config(
        # Outermost, so every HTTP request (a 404 too) gets its span, its count and its access-log line.
        TelemetryMiddleware(app, access_log=not args.disable_access_log),
        host=options.host,
        port=options.port,
        log_level="info",
        log_config=None,
        access_log=False,  # TelemetryMiddleware writes the access log, with request and trace ids
        timeout_graceful_shutdown=int(options.shutdown_timeout) + 5,
    )
    logging.getLogger("spyglass.api").info("starting on http://%s:%d", options.host, options.port)
    _Server(config, app, options.shutdown_timeout).run()
    return 0
