"""`RequestTracer`: the open spans of one engine's requests, driven by its hook events."""

import time
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

from spyglass.core.plugin_api import (
    EngineInfo,
    FinishReason,
    Request,
    StepStats,
    answer_text,
    read_request_answer,
)
from spyglass.plugins.tracing import attributes as attrs
from spyglass.plugins.tracing import root_span
from spyglass.plugins.tracing.answer_attributes import (
    answer_attributes,
    answer_content_attributes,
    answer_message,
)
from spyglass.plugins.tracing.pooling_attributes import pooling_output_attributes
from spyglass.plugins.tracing.step_spans import StepSpans
from spyglass.telemetry import tracing
from spyglass.telemetry.request_context import operation_name
from spyglass.telemetry.settings import TelemetrySettings
from spyglass.telemetry.tracing import monotonic_to_epoch_ns as epoch_ns


@dataclass(slots=True)
class RequestTrace:
    """A request's open span, the phase span under it, and what the phase started with."""

    request: Request
    span: Span
    root: Span | None = None
    phase: Span | None = None
    phase_name: str = ""
    outputs_at_phase_start: int = 0
    computed_before_step: int | None = None


class RequestTracer:
    """Owns the open spans of one engine's requests."""

    def __init__(self, tracer: trace.Tracer, info: EngineInfo, settings: TelemetrySettings):
        self.tracer = tracer
        self.engine_id = info.engine_id
        self.model = settings.served_model_name or info.model_name
        self.tokenizer = getattr(info, "tokenizer", None)
        self.parsers = getattr(info, "parsers", None)
        self.settings = settings
        self.traces: dict[str, RequestTrace] = {}
        self.step_links: list[Link] = []
        self.steps = (
            StepSpans(tracer, self.model, settings.trace_steps_interval_s)
            if settings.trace_steps
            else None
        )

    # -- phases ---------------------------------------------------------------------------------

    def _enter(self, rt: RequestTrace, name: str, start_ns: int, **attributes) -> None:
        """End the current phase span at ``start_ns`` and open the next one there.

        Once the HTTP response has ended (the client went away and the abort is on its way), no
        new phase opens: it would start after its trace's root ended.
        """
        self._leave(rt, start_ns)
        if root_span.ended_at(rt.root) is not None:
            return
        context = trace.set_span_in_context(rt.span)
        rt.phase = self.tracer.start_span(
            name, context=context, start_time=start_ns, attributes=attributes
        )
        rt.phase_name = name
        rt.outputs_at_phase_start = rt.request.num_output_tokens

    def _leave(self, rt: RequestTrace, end_ns: int) -> None:
        if rt.phase is not None:
            rt.phase.end(end_time=max(self._cut(rt, end_ns), rt.phase.start_time))
            rt.phase, rt.phase_name = None, ""

    @staticmethod
    def _cut(rt: RequestTrace, ns: int) -> int:
        """``ns``, but no later than the end of the HTTP span above the request (children end first)."""
        root_end = root_span.ended_at(rt.root)
        return ns if root_end is None else min(ns, root_end)

    def _account_step(self, rt: RequestTrace, step_id: int | None) -> None:
        """Close out the step that just ran for this request: a prefill chunk event, maybe the switch to decode."""
        before, rt.computed_before_step = rt.computed_before_step, None
        if before is None or rt.phase_name != "prefill":
            return
        request = rt.request
        produced = request.num_output_tokens > rt.outputs_at_phase_start
        when = epoch_ns(request.times.last_token) if produced else time.time_ns()
        chunk = {
            "spyglass.num_tokens": request.num_computed_tokens - before,
            "spyglass.num_computed_tokens": request.num_computed_tokens,
        }
        if step_id is not None:
            chunk["spyglass.step.id"] = step_id
        rt.phase.add_event("prefill_chunk", chunk, timestamp=when)
        if produced and not request.is_finished:
            self._enter(rt, "decode", when)

    # -- hook handlers ----------------------------------------------------------------------------

    def added(self, request: Request) -> None:
        parent = request.attributes.get("otel_context")
        start = epoch_ns(request.times.arrival)
        span = self.tracer.start_span(
            f"{operation_name(request)} {self.model}",
            context=parent if isinstance(parent, Context) else Context(),
            kind=SpanKind.INTERNAL,
            start_time=start,
            attributes={
                **attrs.request_attributes(request, self.model),
                "spyglass.engine.id": self.engine_id,
            },
        )
        prompt_text = self._prompt_text(request) if self.settings.trace_content else None
        if prompt_text is not None:
            span.set_attributes(attrs.input_content_attributes(request, prompt_text))
        tracing.remember_request_span(request, span.get_span_context())
        root = root_span.server_span(request)
        if root is not None and root_span.is_first_choice(request):
            root_span.on_added(root, request, self.model, prompt_text)
        rt = RequestTrace(request, span, root)
        self.traces[request.req_id] = rt
        self._enter(rt, "queue", start)

    def scheduled(self, request: Request, resumed: bool) -> None:
        rt = self.traces.get(request.req_id)
        if rt is None:
            return
        now = epoch_ns(time.monotonic()) if resumed else epoch_ns(request.times.first_scheduled)
        if resumed:
            rt.span.add_event("resumed", timestamp=now)
        self._enter(
            rt,
            "prefill",
            now,
            **{
                "spyglass.resumed": resumed,
                "spyglass.num_cached_tokens": request.num_cached_tokens,
            },
        )

    def first_token(self, request: Request) -> None:
        rt = self.traces.get(request.req_id)
        if rt is None:
            return
        when = epoch_ns(request.times.first_token)
        rt.span.add_event("first_token", timestamp=when)
        rt.span.set_attribute("langfuse.observation.completion_start_time", attrs.iso_time(when))

    def preempted(self, request: Request) -> None:
        rt = self.traces.get(request.req_id)
        if rt is None:
            return
        now = time.time_ns()
        rt.span.add_event(
            "preempted",
            {"spyglass.num_computed_tokens": request.num_computed_tokens},
            timestamp=now,
        )
        self._enter(
            rt, "preempted", now, **{"spyglass.num_output_tokens": request.num_output_tokens}
        )

    def finished(self, request: Request, reason: FinishReason) -> None:
        rt = self.traces.pop(request.req_id, None)
        if rt is None:
            return
        self._account_step(rt, None)
        root_end = root_span.ended_at(rt.root)
        end = max(self._cut(rt, epoch_ns(request.times.finished)), rt.span.start_time)
        self._leave(rt, end)
        span = rt.span
        span.add_event(
            "finished", {"gen_ai.response.finish_reasons": [reason.value]}, timestamp=end
        )
        span.set_attributes(attrs.finish_attributes(request, reason))
        output = self._record_output(span, request, reason)
        if reason is FinishReason.ERROR:
            root_span.record_failure(span, request.error)
        if rt.root is not None and root_end is None:
            first = root_span.is_first_choice(request)
            if first or reason is FinishReason.ERROR:
                root_span.on_finished(rt.root, request, reason, output if first else None)
        span.end(end_time=end)

    def _record_output(
        self, span: Span, request: Request, reason: FinishReason
    ) -> root_span.Output | None:
        """The output on the request span: a chat answer's tool calls (always) and, with content
        capture, its text and messages. Returns the output for the HTTP span (content capture
        on): the text, or the assistant message where the answer reasoned or called tools."""
        content = self.settings.trace_content
        if content and request.pooled is not None:
            span.set_attributes(pooling_output_attributes(request))
            return None
        reads_answer = "answer_reading" in request.attributes
        if self.tokenizer is None or not (content or reads_answer):
            return None
        text = answer_text(request, self.tokenizer)
        try:
            answer = read_request_answer(request, text, self.parsers)
        except Exception as error:  # a parser's fault must not keep the span from ending
            span.set_attribute("spyglass.response.read_error", type(error).__name__)
            answer = None
        if answer is not None:
            span.set_attributes(answer_attributes(request, answer))
        if not content:
            return None
        span.set_attributes(attrs.output_content_attributes(text, reason))
        if answer is None:
            return root_span.Output(text)
        span.set_attributes(answer_content_attributes(answer, reason))
        if answer.reasoning or answer.tool_calls:
            return root_span.Output(answer_message(answer), "application/json")
        return root_span.Output(answer.content or "")

    def step_started(self, step_id: int, scheduled: tuple[Request, ...]) -> None:
        self.step_links = []
        for request in scheduled:
            rt = self.traces.get(request.req_id)
            if rt is not None:
                rt.computed_before_step = request.num_computed_tokens
                self.step_links.append(Link(rt.span.get_span_context()))

    def step_finished(self, stats: StepStats) -> None:
        for req_id in stats.req_ids:
            rt = self.traces.get(req_id)
            if rt is not None:
                self._account_step(rt, stats.step_id)
        if self.steps is not None:
            self.steps.record(stats, self.step_links)
        self.step_links = []

    def stopped(self) -> None:
        """End whatever is still open (the engine aborts live requests before this, so normally nothing)."""
        now = time.time_ns()
        for rt in self.traces.values():
            self._leave(rt, now)
            rt.span.end(end_time=now)
        self.traces.clear()
        if self.steps is not None:
            self.steps.close()

    def _prompt_text(self, request: Request) -> str:
        if request.prompt is not None:
            return request.prompt
        return self.tokenizer.decode(request.prompt_token_ids) if self.tokenizer is not None else ""
