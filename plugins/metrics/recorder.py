"""`MetricsRecorder`: one engine's Prometheus series, recorded from its hook events."""

from prometheus_client.metrics import MetricWrapperBase

from spyglass.core.plugin_api import (
    STEP_FORWARDS,
    EngineConfig,
    EngineInfo,
    FinishReason,
    Request,
    StepStats,
)
from spyglass.plugins.metrics.lora_series import LoRASeries
from spyglass.telemetry import metrics as m
from spyglass.telemetry.request_context import operation_name
from spyglass.telemetry.settings import TelemetrySettings
from spyglass.telemetry.tracing import span_context_of

PROVIDER = "spyglass"


def _exemplar(request: Request) -> dict[str, str] | None:
    span_context = span_context_of(request)
    if span_context is None or not span_context.trace_flags.sampled:
        return None
    return {"trace_id": format(span_context.trace_id, "032x")}


class MetricsRecorder:
    """Records one engine's metrics; label children are bound once, here."""

    def __init__(
        self, info: EngineInfo, settings: TelemetrySettings, config: EngineConfig | None = None
    ):
        model = settings.served_model_name or info.model_name
        self.model = model
        self.series = series = m.EngineSeries(model, info.engine_id)
        self.calls: dict[
            str, list[int]
        ] = {}  # API call id -> [choices still running, longest output so far]
        self.settings = settings
        self.hook_errors = getattr(info, "hook_errors", {})
        self.hook_errors_seen: dict[str, int] = {}
        self.progress: dict[
            str, tuple[int, float]
        ] = {}  # req_id -> (output tokens seen, last token time)
        self.live: dict[str, Request] = {}
        self.waiting_classes: set[str] = set()
        self.running = series.labels(m.NUM_REQUESTS_RUNNING)
        self.waiting = series.labels(m.NUM_REQUESTS_WAITING)
        self.kv_usage = series.labels(m.KV_CACHE_USAGE)
        self.prompt_tokens = series.labels(m.PROMPT_TOKENS)
        self.generation_tokens = series.labels(m.GENERATION_TOKENS)
        self.preemptions = series.labels(m.NUM_PREEMPTIONS)
        self.ttft = series.labels(m.TIME_TO_FIRST_TOKEN)
        self.itl = series.labels(m.INTER_TOKEN_LATENCY)
        self.tpot = series.labels(m.TIME_PER_OUTPUT_TOKEN)
        self.e2e = series.labels(m.E2E_REQUEST_LATENCY)
        self.queue_time = series.labels(m.REQUEST_QUEUE_TIME)
        self.preprocess_time = series.labels(m.REQUEST_PREPROCESS_TIME)
        self.prefill_time = series.labels(m.REQUEST_PREFILL_TIME)
        self.decode_time = series.labels(m.REQUEST_DECODE_TIME)
        self.prompt_len = series.labels(m.REQUEST_PROMPT_TOKENS)
        self.generation_len = series.labels(m.REQUEST_GENERATION_TOKENS)
        self.request_preemptions = series.labels(m.REQUEST_NUM_PREEMPTIONS)
        self.inference_time = series.labels(m.REQUEST_INFERENCE_TIME)
        self.params_n = series.labels(m.REQUEST_PARAMS_N)
        self.params_max_tokens = series.labels(m.REQUEST_PARAMS_MAX_TOKENS)
        self.max_generation_tokens = series.labels(m.REQUEST_MAX_NUM_GENERATION_TOKENS)
        self.iteration_tokens = series.labels(m.ITERATION_TOKENS)
        self.step_duration = series.labels(m.ENGINE_STEP_DURATION)
        self.step_phases = {
            p: series.labels(m.ENGINE_STEP_PHASE_DURATION, p)
            for p in ("schedule", "model", "update")
        }
        self.batch_size = series.labels(m.ENGINE_STEP_BATCH_SIZE)
        self.mask_time = series.labels(m.STRUCTURED_OUTPUT_MASK_TIME)
        self.vision_time = series.labels(m.VISION_ENCODER_TIME)
        self.images_encoded = series.labels(m.IMAGES_ENCODED)
        self.image_cache_hits = series.labels(m.IMAGE_CACHE_HITS)
        self.image_chunk_waits = series.labels(m.IMAGE_CHUNK_WAITS)
        self.steps_ahead = series.labels(m.STEPS_SCHEDULED_AHEAD)
        self.forwards = {f: series.labels(m.ENGINE_STEP_FORWARDS, f) for f in STEP_FORWARDS}
        self.graph_tokens = series.labels(m.CUDA_GRAPH_TOKENS)
        self.graph_padding = series.labels(m.CUDA_GRAPH_PADDING_TOKENS)
        self.slo_requests = series.labels(m.SLO_REQUESTS)
        self.slo_ttft_met = series.labels(m.SLO_TTFT_MET)
        self.slo_tpot_met = series.labels(m.SLO_TPOT_MET)
        self.slo_met = series.labels(m.SLO_MET)
        self.spec_drafts = series.labels(m.SPEC_DECODE_NUM_DRAFTS)
        self.spec_draft_tokens = series.labels(m.SPEC_DECODE_NUM_DRAFT_TOKENS)
        self.spec_accepted_tokens = series.labels(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS)
        series.labels(m.SLO_TTFT_TARGET).set(settings.slo_ttft_s)
        series.labels(m.SLO_TPOT_TARGET).set(settings.slo_tpot_s)
        series.labels(
            m.CACHE_CONFIG_INFO,
            str(info.block_size),
            str(info.num_kv_blocks),
            info.kv_cache_dtype or info.dtype,
            str(info.max_model_len),
            str(info.max_num_seqs),
        ).set(1)
        series.labels(
            m.ENGINE_CONFIG_INFO,
            info.device,
            info.dtype,
            info.kernels,
            info.quantization,
            "on" if info.async_output else "off",
            "on" if info.async_scheduling else "off",
            "+".join(info.tasks),
            info.pooling_type,
        ).set(1)
        # Per-adapter series, with LoRA on.
        self.lora = (
            LoRASeries(series, config) if config is not None and config.enable_lora else None
        )
        self._export_zeros(info, config)
        series.labels(m.TENSOR_PARALLEL_SIZE).set(info.tensor_parallel_size)
        self.ready = series.labels(m.ENGINE_READY)
        self.ready.set(1)

    def drafts_verified(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified proposal."""
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(num_draft_tokens)
        self.spec_accepted_tokens.inc(num_accepted_tokens)
        for position in range(num_accepted_tokens):
            self.series.labels(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, str(position)).inc()

    def _export_zeros(self, info: EngineInfo, config) -> None:
        """Create every label set known up front, so dashboards show 0 (not "no data") before the first event."""
        for metric in vars(m).values():
            if isinstance(metric, MetricWrapperBase) and metric._labelnames == tuple(m.M):
                self.series.labels(metric)
        for reason in FinishReason:
            self.series.labels(m.REQUEST_SUCCESS, reason.value)
        for label in info.waiting_classes:
            self.series.labels(m.NUM_REQUESTS_WAITING_BY_CLASS, label).set(0)
        self.waiting_classes |= set(info.waiting_classes)
        for key in self.hook_errors:  # every plugin's event hooks, at 0 until one raises
            self.series.labels(m.PLUGIN_HOOK_ERRORS, *key.split(".", 1))
        if config is not None and config.speculative:
            for position in range(config.num_speculative_tokens):
                self.series.labels(m.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, str(position))
        for operation in ("chat", "text_completion"):
            self.series.child(
                m.GEN_AI_TIME_TO_FIRST_TOKEN, operation, PROVIDER, self.model, self.series.engine
            )
            self.series.child(
                m.GEN_AI_TIME_PER_OUTPUT_TOKEN, operation, PROVIDER, self.model, self.series.engine
            )
        for operation in ("chat", "text_completion", "embeddings", "classify"):
            self.series.child(
                m.GEN_AI_REQUEST_DURATION, operation, PROVIDER, self.model, self.series.engine, ""
            )

    def _gen_ai(self, request: Request) -> tuple[str, str, str, str]:
        return (
            operation_name(request),
            PROVIDER,
            self.model,
            self.series.engine,
        )

    def request_added(self, request: Request) -> None:
        self.live[request.req_id] = request
        if self.lora is not None:
            self.lora.added(request)
        call_id = request.attributes.get("api_request_id", request.req_id)
        if call_id not in self.calls:
            self.calls[call_id] = [request.attributes.get("num_choices", 1), 0]
            self.params_n.observe(request.attributes.get("n", request.sampling_params.n))
            preprocess = request.attributes.get("preprocess_seconds")
            if preprocess is not None:
                self.preprocess_time.observe(preprocess)

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
        self.series.child(m.GEN_AI_TIME_TO_FIRST_TOKEN, *self._gen_ai(request)).observe(
            ttft, exemplar
        )
        self.prompt_tokens.inc(request.num_prompt_tokens)

    def _token_progress(self, request: Request) -> tuple[float, int] | None:
        """The inter-token latency of the tokens the request gained since last seen, and how many
        they are; None when it gained none, or only its first (no token before it)."""
        seen, last_time = self.progress.get(request.req_id, (0, 0.0))
        count = request.num_output_tokens
        if count <= seen:
            return None
        now = request.times.last_token
        self.progress[request.req_id] = (count, now)
        return ((now - last_time) / (count - seen), count - seen) if seen else None

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
        if stats.mask_time:
            self.mask_time.observe(stats.mask_time)
        if stats.num_images_encoded:
            self.vision_time.observe(stats.vision_time)
            self.images_encoded.inc(stats.num_images_encoded)
        if stats.num_images_cached:
            self.image_cache_hits.inc(stats.num_images_cached)
        if stats.num_image_waits:
            self.image_chunk_waits.inc(stats.num_image_waits)
        if stats.scheduled_ahead:
            self.steps_ahead.inc()
        self.forwards[stats.forward].inc()
        if stats.graph_tokens:
            self.graph_tokens.inc(stats.graph_tokens)
            self.graph_padding.inc(stats.graph_tokens - stats.num_scheduled_tokens)
        classes = dict(stats.waiting_by_class)
        for label in self.waiting_classes | classes.keys():
            self.series.labels(m.NUM_REQUESTS_WAITING_BY_CLASS, label).set(classes.get(label, 0))
        self.waiting_classes |= classes.keys()
        if self.lora is not None:
            self.lora.refresh(self.live.values())
        # The requests' tokens of one step were committed together: most share one gap.
        gaps: dict[float, int] = {}
        for req_id in stats.req_ids:
            request = self.live.get(req_id)
            if request is not None and (progress := self._token_progress(request)) is not None:
                gap, n = progress
                gaps[gap] = gaps.get(gap, 0) + n
        for gap, n in gaps.items():
            self.itl.observe_n(gap, n)
        self.sync_hook_errors()

    def request_finished(self, request: Request, reason: FinishReason) -> None:
        if (progress := self._token_progress(request)) is not None:
            self.itl.observe_n(*progress)
        self.live.pop(request.req_id, None)
        self.progress.pop(request.req_id, None)
        if not self.live:
            # The engine may now sit idle with no step to refresh the gauges (an abort between steps).
            self.running.set(0)
            self.waiting.set(0)
            self.kv_usage.set(0)
        times = request.times
        exemplar = _exemplar(request)
        self.series.labels(m.REQUEST_SUCCESS, reason.value).inc()
        if self.lora is not None:
            self.lora.finished(request, reason)
            self.lora.refresh(self.live.values())
        e2e = times.finished - times.arrival
        self.e2e.observe(e2e, exemplar)
        error_type = "error" if reason is FinishReason.ERROR else ""
        self.series.child(m.GEN_AI_REQUEST_DURATION, *self._gen_ai(request), error_type).observe(
            e2e, exemplar
        )
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
                self.series.child(m.GEN_AI_TIME_PER_OUTPUT_TOKEN, *self._gen_ai(request)).observe(
                    tpot, exemplar
                )
        self.prompt_len.observe(request.num_prompt_tokens)
        self.request_preemptions.observe(request.num_preemptions)
        self._call_finished(request)
        if request.sampling_params.pooling is not None:
            # A pooling request generates nothing: its prompt counts when it is answered, and it is
            # judged against no token-latency target.
            if request.pooled is not None:
                self.prompt_tokens.inc(request.num_prompt_tokens)
            return
        self.generation_len.observe(request.num_output_tokens)
        self.params_max_tokens.observe(request.max_tokens)
        if reason is not FinishReason.ABORT:
            self._judge_slo(request, tpot)

    def _judge_slo(self, request: Request, tpot: float | None) -> None:
        """Count the request against the TTFT and TPOT targets; a request without a token meets neither."""
        times = request.times
        ttft_ok = (
            bool(times.first_token)
            and times.first_token - times.arrival <= self.settings.slo_ttft_s
        )
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
                self.series.labels(m.PLUGIN_HOOK_ERRORS, plugin, hook).inc(new)
                self.hook_errors_seen[key] = count

    def stopped(self) -> None:
        """Remove the engine's series, all but ``engine_ready``, which stays at 0 (the not-ready alert reads it)."""
        self.ready.set(0)
        self.series.remove(keep=(m.ENGINE_READY,))
