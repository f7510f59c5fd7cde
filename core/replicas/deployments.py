"""The Ray Serve deployments: `EngineReplica` (a whole Spyglass server per replica) and `Ingress`.

Each replica runs the same app as ``spyglass serve`` (`create_app` under `TelemetryMiddleware`),
served by uvicorn on its own port (``replica_port`` + the replica's rank; 0 for any free port) for
Prometheus and probes, and called in-process by `forward` for traffic that comes through the
ingress. Its metrics carry ``replica="<rank>"``; ranks run 0..N-1 and a restarted replica takes the
rank of the one it replaces, so the label's values stay few. Its responses name it in the
``x-spyglass-replica`` (rank) and ``x-spyglass-replica-id`` (Ray's replica id) headers.
"""

import asyncio
import dataclasses
import logging
import sys

import uvicorn
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from spyglass.core.api.app import create_app
from spyglass.core.api.kept_ids import safe_tag
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig
from spyglass.core.replicas.forward import ForwardedRequest, IngressApp, call_app
from spyglass.core.replicas.router import PrefixAffinityRouter
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.http import TelemetryMiddleware
from spyglass.telemetry.logging import setup_logging

log = logging.getLogger("spyglass.replicas")
REPLICA_HEADER = b"x-spyglass-replica"
REPLICA_ID_HEADER = b"x-spyglass-replica-id"


def _configure_telemetry(telemetry: telemetry_settings.TelemetrySettings, replica: str) -> None:
    setup_logging(stream=sys.stderr)  # JSON lines into the actor's log, as from `spyglass serve`
    labels = (*telemetry.metrics_labels, ("replica", replica))
    telemetry_settings.configure(dataclasses.replace(telemetry, metrics_labels=labels))


@serve.deployment(
    health_check_period_s=5, health_check_timeout_s=30, graceful_shutdown_timeout_s=60
)
class EngineReplica:
    """One engine and its HTTP API in a Ray actor; `forward` serves what the ingress sends it."""

    async def __init__(
        self,
        engine_config: EngineConfig,
        options: ServerOptions,
        telemetry: telemetry_settings.TelemetrySettings,
        replica_port: int,
        access_log: bool = True,
    ):
        context = serve.get_replica_context()
        rank = str(context.rank.rank)
        _configure_telemetry(telemetry, rank)
        self.crash: BaseException | None = None
        port = replica_port + int(rank) if replica_port else 0
        own = dataclasses.replace(
            options, port=port, response_id_tag=safe_tag(context.replica_tag)
        )  # the ids of the responses it keeps name it, for the router
        self.app = create_app(engine_config, own, self._engine_crashed)
        self.http_app = TelemetryMiddleware(self.app, access_log=access_log)
        self.headers = [
            (REPLICA_HEADER, rank.encode()),
            (REPLICA_ID_HEADER, context.replica_tag.encode()),
        ]
        config = uvicorn.Config(
            self.http_app,
            host=options.host,
            port=port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=int(options.shutdown_timeout) + 5,
        )
        self.server = uvicorn.Server(config)
        self.serving = asyncio.ensure_future(self.server.serve())  # its lifespan loads the engine
        while not self.server.started:
            if self.serving.done():
                raise RuntimeError(
                    f"replica {rank} did not start: its engine or port {port} failed (see its log)"
                )
            await asyncio.sleep(0.1)
        log.info(
            "replica %s (%s) serving on http://%s:%d",
            rank,
            context.replica_tag,
            options.host,
            self.server.servers[0].sockets[0].getsockname()[1],
        )

    def _engine_crashed(self, error: BaseException) -> None:
        self.crash = error  # the next health check fails and Ray replaces the replica

    async def forward(self, request: ForwardedRequest):
        """Serve one forwarded HTTP request: yields its `ResponseStart`, then its body's chunks."""
        async for item in call_app(self.http_app, request, self.headers):
            yield item

    async def check_health(self) -> None:
        """Ray Serve's health check: fails once the engine loop or the replica's HTTP server has stopped."""
        serving = getattr(self.app.state, "serving", None)
        if (
            self.crash is not None
            or serving is None
            or not serving.async_engine.is_running
            or self.serving.done()
        ):
            raise RuntimeError(f"replica unhealthy: engine crash {self.crash!r}")

    async def __del__(self):
        # uvicorn's shutdown runs the app's lifespan exit: the engine finishes in-flight requests, then stops.
        self.server.should_exit = True
        await asyncio.wait(
            {self.serving}, timeout=self.server.config.timeout_graceful_shutdown + 10
        )


@serve.deployment(health_check_period_s=5)
@serve.ingress()
class Ingress:
    """The OpenAI-compatible entry point: forwards each call to an `EngineReplica` chosen by the router."""

    def __init__(
        self,
        replicas: DeploymentHandle,
        options: ServerOptions,
        telemetry: telemetry_settings.TelemetrySettings,
        access_log: bool = True,
    ):
        _configure_telemetry(telemetry, "ingress")
        self.replicas = replicas
        self.options = options
        self.access_log = access_log

    def __serve_build_asgi_app__(self):
        """Ray Serve's hook for the ingress's ASGI app."""
        # The replicas' routes, read from the app they run (nothing is loaded until its lifespan starts).
        routes = frozenset(route.path for route in create_app(EngineConfig(), self.options).routes)
        app = IngressApp(
            self._open_stream,
            self.options.max_body_bytes,
            (RayActorError, ActorUnavailableError),
            routes,
        )
        return TelemetryMiddleware(app, access_log=self.access_log)

    async def _open_stream(self, request: ForwardedRequest):
        response = self.replicas.options(stream=True).forward.remote(request)
        try:
            async for item in response:
                yield item
        finally:
            response.cancel()  # the replica's generator is cancelled, and its app sees a disconnect


def build_application(
    engine_config: EngineConfig,
    options: ServerOptions,
    telemetry: telemetry_settings.TelemetrySettings,
    num_replicas: int,
    replica_port: int = 0,
    access_log: bool = True,
    max_load_gap: int = 4,
    request_router: RequestRouterConfig | None = None,
):
    """The Serve application: ``num_replicas`` engines behind one ingress and the prefix-affinity router.

    Each replica reserves ``engine_config.num_threads`` (default 1) of Ray's CPUs and takes up to
    ``max_num_seqs`` requests at once, the engine's batch; the router holds further ones back.
    ``request_router`` replaces the router (``RequestRouterConfig()`` is Ray's default, for comparison).
    """
    router = request_router or RequestRouterConfig(
        request_router_class=PrefixAffinityRouter,
        request_router_kwargs={"max_load_gap": max_load_gap},
    )
    replica = EngineReplica.options(
        num_replicas=num_replicas,
        max_ongoing_requests=engine_config.max_num_seqs,
        ray_actor_options={"num_cpus": engine_config.num_threads or 1},
        request_router_config=router,
    )
    ingress = Ingress.options(
        max_ongoing_requests=options.max_queued_requests, ray_actor_options={"num_cpus": 0}
    )
    return ingress.bind(
        replica.bind(engine_config, options, telemetry, replica_port, access_log),
        options,
        telemetry,
        access_log,
    )
