"""One structured log line per finished request (and one per preemption), joined to its trace.

Lines go to the ``spyglass.requests`` logger with ``req_id``, ``trace_id``, ``span_id`` and
``engine`` (the engine's id); prompt and completion text appear only with the engine's
``TelemetrySettings.log_content``. A chat answer's ``tool_calls`` (how many it made, read as the
API read them) are on its line without opt-in. The entry point names `RequestLogPlugin`: one per
engine.
"""

import logging

from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    FinishReason,
    PluginContext,
    Request,
    answer_text,
    hookimpl,
    read_request_answer,
)
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.logging import get_logger, request_fields

LOGGER_NAME = "spyglass.requests"
log = get_logger(LOGGER_NAME)  # a stateless wrapper around logging.getLogger(LOGGER_NAME)


def _seconds(later: float, earlier: float) -> float | None:
    return round(later - earlier, 6) if later and earlier else None


def summary(request: Request, reason: FinishReason, engine_id: str = "") -> dict:
    """The fields of a finished request's log line: sizes and phase timings in seconds (None if not reached)."""
    times = request.times
    fields = {
        **request_fields(request),
        "engine": engine_id,
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
        fields["tpot_s"] = round(
            (times.last_token - times.first_token) / (request.num_output_tokens - 1), 6
        )
    if request.lora_name is not None:
        fields["lora"] = request.lora_name
    if request.error:
        fields["error"] = request.error
    return fields


class RequestLogPlugin:
    """One engine's request log: its id on every line, its tokenizer and parsers for completion
    text and tool calls."""

    def __init__(self, context: PluginContext):
        self.engine_id = context.engine_id
        self.log_content = telemetry_settings.resolve(context.telemetry).log_content
        self.tokenizer = None
        self.parsers = None

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Keep the tokenizer and parsers: completion text (content logging on) and tool calls."""
        self.tokenizer = info.tokenizer
        self.parsers = info.parsers

    @hookimpl
    def spyglass_request_preempted(self, request: Request) -> None:
        """A preemption is rare and costly: say so."""
        log.info("request preempted", **request_fields(request), engine=self.engine_id,
                 num_computed_tokens=request.num_computed_tokens)  # fmt: skip

    @hookimpl
    def spyglass_request_finished(self, request: Request, reason: FinishReason) -> None:
        """The summary line; errors at warning level. Nothing is computed when the logger is off."""
        level = logging.WARNING if reason is FinishReason.ERROR else logging.INFO
        if not logging.getLogger(LOGGER_NAME).isEnabledFor(level):
            return
        fields = summary(request, reason, self.engine_id)
        text = None
        if self.tokenizer is not None and (
            self.log_content or "answer_reading" in request.attributes
        ):
            text = answer_text(request, self.tokenizer)  # as the client got it
            try:
                answer = read_request_answer(request, text, self.parsers)
            except Exception as error:  # a parser's fault must not cost the line
                fields["read_error"] = type(error).__name__
                answer = None
            if answer is not None and answer.tool_calls:  # read as the API read it
                fields["tool_calls"] = len(answer.tool_calls)
        if self.log_content:
            fields["prompt"] = request.prompt
            if text is not None:
                fields["output"] = text
        log.log(level, "request finished", **fields)
