"""`LoRASeries`: one engine's per-adapter series, and vLLM's LoRA info series for adapter-aware routers."""

import time
from collections.abc import Iterable

from spyglass.core.plugin_api import EngineConfig, FinishReason, Request, RequestStatus
from spyglass.telemetry import metrics as m


class LoRASeries:
    """Live requests, finishes and generated tokens per adapter, and ``lora_requests_info``: the
    adapters of the running and of the waiting requests as labels, the time of the last refresh
    as its value (vLLM's series, read by routers such as the Gateway API Inference Extension's;
    one child at a time, the previous one removed when the adapters change)."""

    def __init__(self, series: m.EngineSeries, config: EngineConfig):
        self.series = series
        self.max_lora = "" if config.max_loras is None else str(config.max_loras)
        self.info_labels: tuple[str, str, str] | None = None
        self.num_live = 0  # live requests with an adapter: without any, a refresh reads no request
        for lora_name in config.lora_modules:
            series.labels(m.LORA_REQUESTS_ACTIVE, lora_name).set(0)
            series.labels(m.LORA_GENERATION_TOKENS, lora_name)
            for reason in FinishReason:
                series.labels(m.LORA_REQUEST_SUCCESS, lora_name, reason.value)
        self.refresh([])

    def added(self, request: Request) -> None:
        """One more live request on the request's adapter."""
        if request.lora_name is not None:
            self.num_live += 1
            self.series.labels(m.LORA_REQUESTS_ACTIVE, request.lora_name).inc()

    def finished(self, request: Request, reason: FinishReason) -> None:
        """The adapter's live requests, finish reasons and generated tokens."""
        name = request.lora_name
        if name is None:
            return
        self.num_live -= 1
        self.series.labels(m.LORA_REQUESTS_ACTIVE, name).dec()
        self.series.labels(m.LORA_REQUEST_SUCCESS, name, reason.value).inc()
        self.series.labels(m.LORA_GENERATION_TOKENS, name).inc(request.num_output_tokens)

    def refresh(self, live: Iterable[Request]) -> None:
        """Set the info series from the live requests (after a step, and when the engine idles)."""
        running: set[str] = set()
        waiting: set[str] = set()
        for request in live if self.num_live else ():
            if request.lora_name is not None:
                group = running if request.status is RequestStatus.RUNNING else waiting
                group.add(request.lora_name)
        labels = (self.max_lora, ",".join(sorted(waiting)), ",".join(sorted(running)))
        if labels != self.info_labels and self.info_labels is not None:
            self.series.forget(m.LORA_REQUESTS_INFO, *self.info_labels)
        self.info_labels = labels
        self.series.labels(m.LORA_REQUESTS_INFO, *labels).set(time.time())
