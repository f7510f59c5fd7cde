"""An audit trail: one JSON line per finished request, written to the file named by ``SPYGLASS_AUDIT_LOG``.

Lines carry ids, the finish reason, token counts and timings, never prompt or output text.
Without ``SPYGLASS_AUDIT_LOG`` (read when an engine starts) the plugin does nothing. The entry
point names `AuditPlugin`, so every engine of a process gets its own instance, file handle and
``engine`` field.
"""

import json
import os
import time
from typing import IO

from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    FinishReason,
    PluginContext,
    Request,
    hookspecs,
    implements,
)

ENV = "SPYGLASS_AUDIT_LOG"


def audit_record(request: Request, reason: FinishReason, model: str) -> dict[str, object]:
    """The audit line for a finished request (durations in seconds, None for phases never reached)."""
    times = request.times

    def since_arrival(moment: float) -> float | None:
        return round(moment - times.arrival, 6) if moment else None

    return {
        "time": time.time(),
        "model": model,
        "req_id": request.req_id,
        "api_request_id": request.attributes.get("api_request_id"),
        "tenant": request.attributes.get("tenant"),
        "reason": reason.value,
        "error": request.error,
        "prompt_tokens": request.num_prompt_tokens,
        "output_tokens": request.num_output_tokens,
        "cached_tokens": request.num_cached_tokens,
        "preemptions": request.num_preemptions,
        "priority": request.sampling_params.priority,
        "queue_s": since_arrival(times.first_scheduled),
        "ttft_s": since_arrival(times.first_token),
        "e2e_s": since_arrival(times.finished),
    }


class AuditPlugin:
    """One engine's audit trail: each engine opens the file for itself and closes it when it stops."""

    def __init__(self, context: PluginContext) -> None:
        self.engine_id = context.engine_id
        self.sink: IO[str] | None = None
        self.model = ""

    @implements(hookspecs.spyglass_engine_started)
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Open the audit file named by ``SPYGLASS_AUDIT_LOG`` (appending), if any."""
        path = os.environ.get(ENV)
        self.model = info.model_name
        # Open for the engine's life, closed in spyglass_engine_stopped.
        self.sink = open(path, "a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115

    @implements(hookspecs.spyglass_request_finished)
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        """Write the request's audit line."""
        if self.sink is not None:
            record = {**audit_record(request, reason, self.model), "engine": self.engine_id}
            self.sink.write(json.dumps(record) + "\n")

    @implements(hookspecs.spyglass_engine_stopped)
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """Close the audit file."""
        if self.sink is not None:
            self.sink.close()
            self.sink = None
