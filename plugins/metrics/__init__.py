"""Prometheus metrics from hook events: scheduler state per step, latencies per request, SLO attainment.

Every metric is defined in `spyglass.telemetry.metrics`; this plugin only records. It keeps one
`MetricsRecorder` for the engine that started last (one engine per process is the serving case).
The ``model_name`` label is the served model name when one is set. Every series whose labels
are known at start exists from the start, at zero, so that panels show 0 and ``rate()`` and
``increase()`` see the first event.
"""

from prometheus_client.metrics import MetricWrapperBase
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.request import FinishReason, Request
from spyglass.core.engine.step_stats import EngineInfo, StepStats
from spyglass.telemetry import metrics as m
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.tracing import span_context_of

PROVIDER = "spyglass"


def _exemplar(request: Request) -> dict[str, str] | None:
    span_context = span_context_of(request)
    if span_context is None or not span_context.trace_flags.sampled:
        return None
    return {"trace_id": format(span_context.trace_id, "032x")}


class MetricsRecorder:
    """Records one engine's metrics; label children are bound once, here."""

    def __init__(self, info: EngineInfo, settings: telemetry_settings.TelemetrySettings, config=None):
        model = settings.served_model_name or info.model_name
        self.model = model
        self.engine_model = info.model_name
        self.calls: dict[str, list[int]] = {}  # API call id -> [choices still running, longest output so far]
        self.settings = settings
        self.hook_errors = getattr(info, "hook_errors", {})
        self.hook_errors_seen: dict[str, int] = {}
        self.progress: dict[str, tuple[int, float]] = {}  # req_id -> (output tokens seen, last token time)
        self.live: dict[str, Request] = {}
        self.waiting_classes: set[str] = set()
        self.running = m.NUM_REQUESTS_RUNNING.labels(model)
        self.waiting = m.NUM_REQUESTS_WAITING.labels(model)
        self.kv_usage = m.KV_CACHE_USAGE.labels(model)
        self.prompt_tokens = m.PROMPT_TOKENS.labels(model)
        self.generation_tokens = m.GENERATION_TOKENS.labels(model)
        self.preemptions = m.NUM_PREEMPTIONS.labels(model)
        self.ttft = m.TIME_TO_FIRST_TOKEN.labels(model)
        self.itl = m.INTER_TOKEN_LATENCY.labels(model)
        self.tpot = m.TIME_PER_OUTPUT_TOKEN.labels(model)
        self.e2e = m.E2E_REQUEST_LATENCY.labels(model)
        self.queue_time = m.REQUEST_QUEUE_TIME.labels(model)
        self.prefill_time = m.REQUEST_PREFILL_TIME.labels(model)
        self.decode_time = m.REQUEST_DECODE_TIME.labels(model)
        self.prompt_len = m.REQUEST_PROMPT_TOKENS.labels(model)
        self.generation_len = m.REQUEST_GENERATION_TOKENS.labels(model)
        self.request_preemptions = m.REQUEST_NUM_PREEMPTIONS.labels(model)
        self.inference_time = m.REQUEST_INFERENCE_TIME.labels(model)
        self.params_n = m.REQUEST_PARAMS_N.labels(model)
        self.params_max_tokens = m.REQUEST_PARAMS_MAX_TOKENS.labels(model)
        self.max_generation_tokens = m.REQUEST_MAX_NUM_GENERATION_TOKENS.labels(model)
        self.iteration_tokens = m.ITERATION_TOKENS.labels(model)
        self.step_duration = m.ENGINE_STEP_DURATION.labels(model)
        self.step_phases = {p: m.ENGINE_STEP_PHASE_DURATION.labels(model, p) for p in ("schedule", "model", "update")}
        self.batch_size = m.ENGINE_STEP_BATCH_SIZE.labels(model)
        self.slo_requests = m.SLO_REQUESTS.labels(model)
        self.slo_ttft_met = m.SLO_TTFT_MET.labels(model)
        self.slo_tpot_met = m.SLO_TPOT_MET.labels(model)
        self.slo_met = m.SLO_MET.labels(model)
        self.spec_drafts = m.SPEC_DECODE_NUM_DRAFTS.labels(model)
        self.spec_draft_tokens = m.SPEC_DECODE_NUM_DRAFT_TOKENS.labels(model)
        self.spec_accepted_tokens = m.SPEC_DECODE_NUM_ACCEPTED_TOKENS.labels(model)
        m.SLO_TTFT_TARGET.labels(model).set(settings.slo_ttft_s)
        m.SLO_TPOT_TARGET.labels(model).set(settings.slo_tpot_s)
        m.CACHE_CONFIG_INFO.labels(
            model, str(info.block_size), str(info.num_kv_blocks), info.dtype, str(info.max_model_len),
            str(info.max_num_seqs),
        ).set(1)
        self._export_zeros(info, config)
        m.TENSOR_PARALLEL_SIZE.labels(model).set(info.tensor_parallel_size)
        self.ready = m.ENGINE_READY.labels(model)
        self.ready.set(1)

    def drafts_verified(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified proposal."""
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(num_draft_tokens)
        self.spec_accepted_tokens.inc(num_accepted_tokens)
        for position in range(num_accepted_tokens):
            m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS.labels(self.model, str(position)).inc()

    def _export_zeros(self, info: EngineInfo, config) -> None:
        """Create every label set known up front, so dashboards show 0 (not "no data") before the first event."""
        for metric in vars(m).values():
            if isinstance(metric, MetricWrapperBase) and metric._labelnames == ("model_name",):
                metric.labels(self.model)
        for reason in FinishReason:
            m.REQUEST_SUCCESS.labels(self.model, reason.value)
        for label in info.waiting_classes:
            m.NUM_REQUESTS_WAITING_BY_CLASS.labels(self.model, label).set(0)
        self.waiting_classes |= set(info.waiting_classes)
        for key in self.hook_errors:  # every plugin's event hooks, at 0 until one raises
            m.PLUGIN_HOOK_ERRORS.labels(self.model, *key.split(".", 1))
        if config is not None and config.speculative:
            for position in range(config.num_speculative_tokens):
                m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS.labels(self.model, str(position))
        for operation in ("chat", "text_completion"):
            m.GEN_AI_TIME_TO_FIRST_TOKEN.labels(operation, PROVIDER, self.model)
            m.GEN_AI_TIME_PER_OUTPUT_TOKEN.labels(operation, PROVIDER, self.model)
            m.GEN_AI_REQUEST_DURATION.labels(operation, PROVIDER, self.model, "")

    def _gen_ai(self, request: Request) -> tuple[str, str, str]:
        return (request.attributes.get("operation", "text_completion"), PROVIDER, self.model)

    def request_added(self, request: Request) -> None:
        self.live[request.req_id] = request
        call_id = request.attributes.get("api_request_id", request.req_id)
        if call_id not in self.calls:
            self.calls[call_id] = [request.attributes.get("num_choices", 1), 0]
            self.params_n.observe(request.attributes.get("n", request.sampling_params.n))

    def _call_finished(self, request: Request) -> None:
        """Observe the longest output of the request's API call once its last choice has finished."""
        call_id = request.attributes.get("api_request_id", request.req_id)
        call = self.calls.get(call_id)
        if call is None:
            return
        call[0] -= 1
        call[1] = max(call[1], request.num_output_tokens)
        if call[0] <= 0:
            del self.calls[call_id]
            self.max_generation_tokens.observe(call[1])

    def first_token(self, request: Request) -> None:
        ttft = request.times.first_token - request.times.arrival
        exemplar = _exemplar(request)
        self.ttft.observe(ttft, exemplar)
        m.GEN_AI_TIME_TO_FIRST_TOKEN.labels(*self._gen_ai(request)).observe(ttft, exemplar)
        self.prompt_tokens.inc(request.num_prompt_tokens)

    def _token_progress(self, request: Request) -> None:
        """Observe inter-token latencies for the tokens the request gained since last seen."""
        seen, last_time = self.progress.get(request.req_id, (0, 0.0))
        count = request.num_output_tokens
        if count <= seen:
            return
        now = request.times.last_token
        if seen:
            gap = (now - last_time) / (count - seen)
            for _ in range(count - seen):
                self.itl.observe(gap)
        self.progress[request.req_id] = (count, now)

    def step_finished(self, stats: StepStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self.generation_tokens.inc(stats.num_generated_tokens)
        self.iteration_tokens.observe(stats.num_scheduled_tokens)
        self.batch_size.observe(len(stats.req_ids))
        self.step_duration.observe(stats.end_time - stats.start_time)
        self.step_phases["schedule"].observe(stats.schedule_time)
        self.step_phases["model"].observe(stats.model_time)
        self.step_phases["update"].observe(stats.update_time)
        classes = dict(stats.waiting_by_class)
        for label in self.waiting_classes | classes.keys():
            m.NUM_REQUESTS_WAITING_BY_CLASS.labels(self.model, label).set(classes.get(label, 0))
        self.waiting_classes |= classes.keys()
        for req_id in stats.req_ids:
            request = self.live.get(req_id)
            if request is not None:
                self._token_progress(request)
        self.sync_hook_errors()

    def request_finished(self, request: Request, reason: FinishReason) -> None:
        self._token_progress(request)
        self.live.pop(request.req_id, None)
        self.progress.pop(request.req_id, None)
        times = request.times
        exemplar = _exemplar(request)
        m.REQUEST_SUCCESS.labels(self.model, reason.value).inc()
        e2e = times.finished - times.arrival
        self.e2e.observe(e2e, exemplar)
        error_type = "error" if reason is FinishReason.ERROR else ""
        m.GEN_AI_REQUEST_DURATION.labels(*self._gen_ai(request), error_type).observe(e2e, exemplar)
        if times.first_scheduled:
            self.queue_time.observe(times.first_scheduled - times.arrival, exemplar)
            self.inference_time.observe(times.finished - times.first_scheduled, exemplar)
        tpot = None
        if times.first_token:
            self.prefill_time.observe(times.first_token - times.first_scheduled, exemplar)
            self.decode_time.observe(times.last_token - times.first_token, exemplar)
            if request.num_output_tokens > 1:
                tpot = (times.last_token - times.first_token) / (request.num_output_tokens - 1)
                self.tpot.observe(tpot, exemplar)
                m.GEN_AI_TIME_PER_OUTPUT_TOKEN.labels(*self._gen_ai(request)).observe(tpot, exemplar)
        self.prompt_len.observe(request.num_prompt_tokens)
        self.generation_len.observe(request.num_output_tokens)
        self.request_preemptions.observe(request.num_preemptions)
        self.params_max_tokens.observe(request.max_tokens)
        self._call_finished(request)
        if reason is not FinishReason.ABORT:
            self._judge_slo(request, tpot)

    def _judge_slo(self, request: Request, tpot: float | None) -> None:
        """Count the request against the TTFT and TPOT targets; a request without a token meets neither."""
        times = request.times
        ttft_ok = bool(times.first_token) and times.first_token - times.arrival <= self.settings.slo_ttft_s
        tpot_ok = bool(times.first_token) and (tpot is None or tpot <= self.settings.slo_tpot_s)
        self.slo_requests.inc()
        if ttft_ok:
            self.slo_ttft_met.inc()
        if tpot_ok:
            self.slo_tpot_met.inc()
        if ttft_ok and tpot_ok:
            self.slo_met.inc()

    def sync_hook_errors(self) -> None:
        """Turn the engine's per-hook error counts into counter increments."""
        for key, count in list(self.hook_errors.items()):
            new = count - self.hook_errors_seen.get(key, 0)
            if new > 0:
                plugin, _, hook = key.partition(".")
                m.PLUGIN_HOOK_ERRORS.labels(self.model, plugin, hook).inc(new)
                self.hook_errors_seen[key] = count

    def stopped(self) -> None:
        self.sync_hook_errors()
        self.ready.set(0)
        self.running.set(0)
        self.waiting.set(0)
        self.kv_usage.set(0)
        for label in self.waiting_classes:
            m.NUM_REQUESTS_WAITING_BY_CLASS.labels(self.model, label).set(0)


_recorder: MetricsRecorder | None = None


@hookimpl
def spyglass_engine_started(info, config):
    """Start recording for this engine, unless metrics are switched off."""
    global _recorder
    settings = telemetry_settings.current()
    _recorder = MetricsRecorder(info, settings, config) if settings.metrics else None


@hookimpl
def spyglass_engine_stopped(info):
    """Zero the gauges and flush the hook error counts."""
    global _recorder
    if _recorder is not None and _recorder.engine_model == info.model_name:
        _recorder.stopped()
        _recorder = None


@hookimpl
def spyglass_request_added(request):
    """Track the request for its inter-token latencies."""
    if _recorder is not None:
        _recorder.request_added(request)


@hookimpl
def spyglass_request_first_token(request):
    """TTFT and prompt tokens."""
    if _recorder is not None:
        _recorder.first_token(request)


@hookimpl
def spyglass_request_preempted(request):
    """Count a preemption."""
    if _recorder is not None:
        _recorder.preemptions.inc()


@hookimpl(trylast=True)
def spyglass_request_finished(request, reason):
    """Finish reason, per-request latencies and lengths, SLO attainment (after the tracing plugin ran)."""
    if _recorder is not None:
        _recorder.request_finished(request, reason)


@hookimpl
def spyglass_drafts_verified(request, num_draft_tokens, num_accepted_tokens):
    """Speculative decoding: proposals, draft tokens, accepted tokens and acceptance by position."""
    if _recorder is not None:
        _recorder.drafts_verified(num_draft_tokens, num_accepted_tokens)


@hookimpl
def spyglass_step_finished(stats):
    """Gauges, tokens and step histograms."""
    if _recorder is not None:
        _recorder.step_finished(stats)
