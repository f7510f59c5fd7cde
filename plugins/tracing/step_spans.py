"""Engine step spans (``--trace-steps``), grouped so that they do not flood the trace list.

A step span of its own per step made a root trace per step (160 of 183 traces in one run).
Instead, the steps of one busy period share a trace: an ``engine_steps`` root span opens with
the first step after the engine was idle and closes when the engine is idle again (nothing
running or waiting) or when it has been open ``interval_s``, so a long busy period becomes one
trace per interval. Each ``engine_step`` span is its child and links to the request spans it
served; request traces stay the requests' own. Phoenix and Tempo list one ``engine_steps``
trace per busy interval beside the request traces, and a step is one click from its requests.
"""

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span

from spyglass.core.plugin_api import StepStats
from spyglass.telemetry.tracing import perf_counter_to_epoch_ns


class StepSpans:
    """The open ``engine_steps`` group of one engine and the step spans under it."""

    def __init__(self, tracer: trace.Tracer, model: str, interval_s: float):
        self.tracer = tracer
        self.model = model
        self.interval_ns = int(interval_s * 1e9)
        self.group: Span | None = None
        self.group_start_ns = 0
        self.last_end_ns = 0
        self.num_steps = 0

    def record(self, stats: StepStats, links: list[Link]) -> None:
        """One ``engine_step`` span for ``stats``, in the current group (opened or rotated as needed)."""
        start_ns = perf_counter_to_epoch_ns(stats.start_time)
        end_ns = perf_counter_to_epoch_ns(stats.end_time)
        if self.group is not None and start_ns - self.group_start_ns >= self.interval_ns:
            self.close()
        if self.group is None:
            self.group = self.tracer.start_span(
                "engine_steps",
                context=Context(),
                start_time=start_ns,
                attributes={"llm.model_name": self.model, "openinference.span.kind": "CHAIN"},
            )
            self.group_start_ns, self.num_steps = start_ns, 0
        span = self.tracer.start_span(
            "engine_step",
            context=trace.set_span_in_context(self.group),
            start_time=start_ns,
            links=links,
            attributes=step_attributes(stats, self.model),
        )
        span.end(end_time=end_ns)
        self.last_end_ns, self.num_steps = end_ns, self.num_steps + 1
        if stats.num_running == 0 and stats.num_waiting == 0:
            self.close()

    def close(self) -> None:
        """End the open group (at the end of its last step), if any."""
        if self.group is not None:
            self.group.set_attribute("spyglass.steps.num_steps", self.num_steps)
            self.group.end(end_time=self.last_end_ns)
            self.group = None


def step_attributes(stats: StepStats, model: str) -> dict:
    """A step's batch composition, tokens, scheduler state and phase timings."""
    return {
        "spyglass.step.id": stats.step_id,
        "spyglass.step.batch_size": len(stats.req_ids),
        "spyglass.step.num_prefill_reqs": stats.num_prefill_reqs,
        "spyglass.step.num_decode_reqs": stats.num_decode_reqs,
        "spyglass.step.num_scheduled_tokens": stats.num_scheduled_tokens,
        "spyglass.step.num_prefill_tokens": stats.num_prefill_tokens,
        "spyglass.step.num_generated_tokens": stats.num_generated_tokens,
        "spyglass.step.num_preempted": stats.num_preempted,
        "spyglass.step.num_running": stats.num_running,
        "spyglass.step.num_waiting": stats.num_waiting,
        "spyglass.step.kv_cache_usage": stats.kv_cache_usage,
        "spyglass.step.schedule_time": stats.schedule_time,
        "spyglass.step.model_time": stats.model_time,
        "spyglass.step.update_time": stats.update_time,
        "spyglass.step.scheduled_ahead": stats.scheduled_ahead,
        "spyglass.step.forward": stats.forward,
        "spyglass.step.graph_tokens": stats.graph_tokens,
        "spyglass.tensor_parallel_size": stats.tensor_parallel_size,
        "llm.model_name": model,
    }
