"""The small endpoints: models, health, version, Prometheus metrics and the engine's debug views."""

import asyncio

from litestar import HttpMethod, MediaType, Request, Response, get, route
from litestar.di import NamedDependency
from litestar.params import FromPath
from prometheus_client import REGISTRY

import spyglass
from spyglass.core.api.context import ServingContext
from spyglass.core.api.errors import APIError
from spyglass.core.api.schemas import ModelCard, ModelList
from spyglass.core.engine.engine_loop import EngineDeadError
from spyglass.core.engine.snapshot import RequestSnapshot
from spyglass.telemetry.exposition import MergedRegistry, render_metrics
from spyglass.telemetry.process_bridge import collect_metric_families


def _model_cards(serving: ServingContext) -> list[ModelCard]:
    """The model this server serves, then each loaded LoRA adapter (its ``parent`` is the model)."""
    base = ModelCard(serving.model_name, serving.created, serving.max_model_len)
    adapters = [
        ModelCard(
            info.name,
            serving.created,
            serving.max_model_len,
            root=info.path,
            parent=serving.model_name,
        )
        for info in serving.loras.values()
    ]
    return [base, *adapters]


@get("/v1/models", summary="List the served model and its LoRA adapters", tags=["openai"])
async def list_models(serving: NamedDependency[ServingContext]) -> ModelList:
    """The model this server serves, then each loaded LoRA adapter."""
    return ModelList(_model_cards(serving))


@get("/v1/models/{model:path}", summary="One served model or LoRA adapter", tags=["openai"])
async def retrieve_model(
    model: FromPath[str], serving: NamedDependency[ServingContext]
) -> ModelCard:
    """The card of the served model (under any of its served names) or of a loaded adapter; a 404
    naming what is served otherwise. Ids may hold slashes (``org/model``)."""
    adapter = serving.check_model(model.removeprefix("/"))
    cards = {card.id: card for card in _model_cards(serving)}
    return cards[adapter or serving.model_name]


def _liveness(serving: ServingContext) -> Response:
    """200 while the engine loop runs (draining included: the process is fine), 503 once it stopped."""
    if not serving.async_engine.is_running:
        return Response({"status": "unavailable"}, status_code=503)
    return Response({"status": "draining" if serving.draining else "ok"}, status_code=200)


@get("/health", summary="Liveness", opt={"public": True}, media_type=MediaType.JSON)
async def health(serving: NamedDependency[ServingContext]) -> Response:
    """200 while the engine loop runs (draining included: the process is fine), 503 once it stopped."""
    return _liveness(serving)


@route(
    "/ping",
    http_method=[HttpMethod.GET, HttpMethod.POST],
    summary="Liveness, as SageMaker asks for it",
    opt={"public": True},
    media_type=MediaType.JSON,
)
async def ping(serving: NamedDependency[ServingContext]) -> Response:
    """`health` under the path SageMaker's health checks use (as vLLM serves it)."""
    return _liveness(serving)


@get("/ready", summary="Readiness", opt={"public": True}, media_type=MediaType.JSON)
async def ready(serving: NamedDependency[ServingContext]) -> Response:
    """200 while the model is loaded and new requests are admitted; 503 while draining or stopped."""
    admitting = serving.async_engine.is_alive and not serving.draining
    return Response(
        {"status": "ready" if admitting else "unavailable"}, status_code=200 if admitting else 503
    )


@get("/version", summary="Spyglass version", opt={"public": True})
async def version() -> dict:
    """The server's version."""
    return {"version": spyglass.__version__}


@get("/metrics", summary="Prometheus metrics", opt={"metrics": True}, include_in_schema=False)
async def metrics(request: Request, serving: NamedDependency[ServingContext]) -> Response:
    """Prometheus text format, or OpenMetrics when the ``Accept`` header asks for it.

    With the engine in a process of its own, its samples are fetched from there (beside its loop,
    not between steps) and merged with this process's HTTP metrics.
    """
    registry = REGISTRY
    if serving.async_engine.is_running:
        try:
            families = await asyncio.wait_for(
                serving.async_engine.metric_families(collect_metric_families), 10
            )
        except (TimeoutError, EngineDeadError):
            raise APIError(
                503, "the engine did not answer in time", code="engine_unavailable"
            ) from None
        if families is not None:
            registry = MergedRegistry(families)
    body, content_type = render_metrics(request.headers.get("accept"), registry)
    return Response(body, media_type=content_type)


@get("/debug/kv", summary="KV cache and queue sizes", tags=["debug"])
async def debug_kv(serving: NamedDependency[ServingContext]) -> dict:
    """Free and total KV blocks, running and waiting requests, read in the engine thread between steps."""
    snapshot = await serving.snapshot()
    return {
        "num_free_blocks": snapshot.num_free_blocks,
        "num_blocks": snapshot.num_blocks,
        "kv_usage": snapshot.kv_usage,
        "num_running": snapshot.num_running,
        "num_waiting": snapshot.num_waiting,
        "num_requests": snapshot.num_requests,
    }


@get("/debug/requests", summary="Every live request's state", tags=["debug"])
async def debug_requests(serving: NamedDependency[ServingContext]) -> list[RequestSnapshot]:
    """Each request the engine holds: status, token counts, KV blocks, preemptions (no prompt text)."""
    return list((await serving.snapshot(with_requests=True)).requests)


ROUTES = [
    list_models,
    retrieve_model,
    health,
    ping,
    ready,
    version,
    metrics,
    debug_kv,
    debug_requests,
]
