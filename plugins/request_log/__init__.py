"""One structured log line per finished request (and one per preemption), joined to its trace.

Lines go to the ``spyglass.requests`` logger with ``req_id``, ``trace_id`` and ``span_id``;
prompt and completion text appear only with ``TelemetrySettings.log_content``.
"""

import logging

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.request import FinishReason, Request
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.logging import get_logger, request_fields

LOGGER_NAME = "spyglass.requests"
log = get_logger(LOGGER_NAME)
_tokenizer = None


def _seconds(later: float, earlier: float) -> float | None:
    return round(later - earlier, 6) if later and earlier else None


def summary(request: Request, reason: FinishReason) -> dict:
    """The fields of a finished request's log line: sizes and phase timings in seconds (None if not reached)."""
    times = request.times
    fields = {
        **request_fields(request),
        "finish_reason": reason.value,
        "operation": request.attributes.get("operation", "text_completion"),
        "prompt_tokens": request.num_prompt_tokens,
        "output_tokens": request.num_output_tokens,
        "cached_tokens": request.num_cached_tokens,
        "preemptions": request.num_preemptions,
        "queue_s": _seconds(times.first_scheduled, times.arrival),
        "ttft_s": _seconds(times.first_token, times.arrival),
        "prefill_s": _seconds(times.first_token, times.first_scheduled),
        "decode_s": _seconds(times.last_token, times.first_token),
        "tpot_s": None,
        "e2e_s": _seconds(times.finished, times.arrival),
    }
    if request.num_output_tokens > 1 and times.first_token:
        fields["tpot_s"] = round((times.last_token - times.first_token) / (request.num_output_tokens - 1), 6)
    if request.error:
        fields["error"] = request.error
    if telemetry_settings.current().log_content:
        fields["prompt"] = request.prompt
        if _tokenizer is not None:
            fields["output"] = _tokenizer.decode(request.output_token_ids)
    return fields


@hookimpl
def spyglass_engine_started(info):
    """Keep the tokenizer, to log completion text when content logging is on."""
    global _tokenizer
    _tokenizer = getattr(info, "tokenizer", None)


@hookimpl
def spyglass_request_preempted(request):
    """A preemption is rare and costly: say so."""
    log.info("request preempted", **request_fields(request), num_computed_tokens=request.num_computed_tokens)


@hookimpl
def spyglass_request_finished(request, reason):
    """The summary line; errors at warning level. Nothing is computed when the logger is off."""
    level = logging.WARNING if reason is FinishReason.ERROR else logging.INFO
    if logging.getLogger(LOGGER_NAME).isEnabledFor(level):
        log.log(level, "request finished", **summary(request, reason))
