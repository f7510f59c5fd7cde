"""An audit trail: one JSON line per finished request, written to the file named by ``SPYGLASS_AUDIT_LOG``.

Lines carry ids, the finish reason, token counts and timings, never prompt or output text.
Without ``SPYGLASS_AUDIT_LOG`` (read when an engine starts) the plugin does nothing.
"""

import json
import os
import time
from typing import IO

from spyglass.core.plugin_api import EngineConfig, EngineInfo, FinishReason, Request, hookspecs, implements

ENV = "SPYGLASS_AUDIT_LOG"

_sink: IO[str] | None = None
_model = ""


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


@implements(hookspecs.spyglass_engine_started)
def spyglass_engine_started(info: EngineInfo, config: EngineConfig) -> None:
    """Open the audit file named by ``SPYGLASS_AUDIT_LOG`` (appending), if any."""
    global _sink, _model
    path = os.environ.get(ENV)
    _model = info.model_name
    if _sink is not None:
        _sink.close()
    _sink = open(path, "a", encoding="utf-8", buffering=1) if path else None


@implements(hookspecs.spyglass_request_finished)
def spyglass_request_finished(request: Request, reason: FinishReason) -> None:
    """Write the request's audit line."""
    if _sink is not None:
        _sink.write(json.dumps(audit_record(request, reason, _model)) + "\n")


@implements(hookspecs.spyglass_engine_stopped)
def spyglass_engine_stopped(info: EngineInfo) -> None:
    """Close the audit file."""
    global _sink
    if _sink is not None:
        _sink.close()
        _sink = None
