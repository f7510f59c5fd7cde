"""Run the HTTP app under uvicorn until a signal arrives: the heavy half of ``spyglass serve``."""

import argparse
import logging
import signal

import uvicorn

from spyglass.core.api.app import begin_shutdown, create_app
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine_args import engine_config_from_args
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.cli_options import settings_from_args
from spyglass.telemetry.http import TelemetryMiddleware
from spyglass.telemetry.logging import setup_logging


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


def serve(args: argparse.Namespace, options: ServerOptions) -> int:
    """Load the engine, then listen on ``options.host:port`` until SIGINT or SIGTERM."""
    setup_logging()
    telemetry_settings.configure(settings_from_args(args))
    engine_config = engine_config_from_args(args)
    app = create_app(engine_config, options)
    config = uvicorn.Config(
        # Outermost, so every HTTP request (a 404 too) gets its span and its count.
        TelemetryMiddleware(app),
        host=options.host,
        port=options.port,
        log_level="info",
        log_config=None,
        access_log=not args.disable_access_log,
        timeout_graceful_shutdown=int(options.shutdown_timeout) + 5,
    )
    # uvicorn runs the app's start-up (the engine load) before it binds: "Serving ... on" follows when ready.
    logging.getLogger("spyglass.api").info(
        "loading %s; the server listens on http://%s:%d once it is loaded",
        engine_config.model or "the default model", options.host, options.port,
    )
    _Server(config, app, options.shutdown_timeout).run()
    return 0
