"""Run the HTTP app under uvicorn until a signal arrives: the heavy half of ``spyglass serve``."""

import argparse
import logging
import signal
import threading

import uvicorn

from spyglass.core.api.app import begin_shutdown, create_app
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine_process import LoadingEngineProcess
from spyglass.telemetry.http import TelemetryMiddleware

log = logging.getLogger("spyglass.api")


class _Server(uvicorn.Server):
    """uvicorn, plus: SIGTERM or SIGINT first drains the engine while still listening, then stops the server.

    While draining, ``/ready`` answers 503 and new requests get a 503; once the engine has finished
    or aborted what was in flight, uvicorn closes the listener and exits 0. A second signal stops
    the listener at once. If the engine loop crashes, the server stops and `serve` returns 1.
    """

    def __init__(self, config: uvicorn.Config, app, shutdown_timeout: float):
        super().__init__(config)
        self.app = app
        self.shutdown_timeout = shutdown_timeout
        self.engine_crashed = False

    def handle_exit(self, sig, frame) -> None:
        drain = begin_shutdown(self.app, self.shutdown_timeout)
        if drain is None:
            super().handle_exit(sig, frame)
        else:
            threading.Thread(
                target=self._exit_after, args=(drain,), name="spyglass-exit", daemon=True
            ).start()
        # uvicorn re-raises captured signals after shutdown; a drained stop is a clean exit, not a traceback.
        self._captured_signals = [
            s for s in self._captured_signals if s not in (signal.SIGTERM, signal.SIGINT)
        ]

    def _exit_after(self, drain: threading.Thread) -> None:
        drain.join()
        self.should_exit = True

    def engine_crash(self, error: BaseException) -> None:
        """The engine loop failed: stop serving so that the process exits non-zero."""
        self.engine_crashed = True
        self.should_exit = True


def serve(
    args: argparse.Namespace,
    options: ServerOptions,
    engine_config: EngineConfig,
    loading: LoadingEngineProcess | None = None,
) -> int:
    """Load the engine (or wait for ``loading``), then listen on ``options.host:port`` until SIGINT or
    SIGTERM; 1 if the engine crashed."""
    # ``server`` is bound below, before the engine (started by the server's lifespan) can crash.
    app = create_app(engine_config, options, lambda error: server.engine_crash(error), loading)
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
    # uvicorn runs the app's start-up (the engine load) before it binds: "Serving ... on" follows when ready.
    log.info(
        "loading %s; the server listens on http://%s:%d once it is loaded",
        engine_config.model or "the default model",
        options.host,
        options.port,
    )
    server = _Server(config, app, options.shutdown_timeout)
    server.run()
    if server.engine_crashed:
        log.error("exiting because the engine loop crashed")
        return 1
    return 0
