"""Every Prometheus metric Spyglass exports, defined once, in the default registry.

Names follow vLLM's (``vllm:`` becomes ``spyglass:``; ``--metrics-namespace vllm`` exports
vLLM's exact names, see `spyglass.telemetry.exposition`) so existing dashboards and alerts carry
over; every engine metric has a ``model_name`` label (the served model name) and an ``engine``
label (the engine's id, `EngineConfig.engine_id`; vLLM labels its per-engine stat loggers the
same way). The ``gen_ai_server_*`` histograms are the OpenTelemetry GenAI server metrics in
Prometheus naming, with the convention's buckets, plus the ``engine`` label. The
plugins in ``plugins/metrics`` (and the prefix-cache and speculative-decoding plugins) record
them from hook events; ``telemetry/http.py`` records the HTTP ones. Nothing here runs inside
the model step.
"""

import os
import time

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from spyglass.telemetry.counted_histogram import CountedHistogram

# The ``*_created`` series double the scrape size and no dashboard reads them (vLLM drops them too).
disable_created_metrics()

# The labels of every engine metric: which model, served by which engine of the process.
M = ["model_name", "engine"]

# vLLM's buckets, with a few sub-10 ms ones added for per-token latencies on fast hardware.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_COUNT_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))
STEP_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
STEP_DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# OpenTelemetry GenAI semantic conventions: the buckets they specify for the server histograms.
GEN_AI_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
GEN_AI_TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
GEN_AI_DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)

# -- scheduler state (set every step) ----------------------------------------------------------
ENGINE_READY = Gauge("spyglass:engine_ready", "1 while the engine runs, 0 once it has stopped.", M)
TENSOR_PARALLEL_SIZE = Gauge(
    "spyglass:tensor_parallel_size",
    "Ranks (processes) that run each forward: 1 without tensor parallelism.",
    M,
)
NUM_REQUESTS_RUNNING = Gauge("spyglass:num_requests_running", "Requests in the running batch.", M)
NUM_REQUESTS_WAITING = Gauge(
    "spyglass:num_requests_waiting", "Requests waiting to be scheduled.", M
)
NUM_REQUESTS_WAITING_BY_CLASS = Gauge(
    "spyglass:num_requests_waiting_by_class",
    "Waiting requests by the scheduling policy's class.",
    M + ["scheduling_class"],
)
KV_CACHE_USAGE = Gauge(
    "spyglass:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", M
)

# -- counters ----------------------------------------------------------------------------------
PROMPT_TOKENS = Counter(
    "spyglass:prompt_tokens", "Prefill tokens processed (prefix-cache hits included).", M
)
GENERATION_TOKENS = Counter("spyglass:generation_tokens", "Tokens generated.", M)
NUM_PREEMPTIONS = Counter("spyglass:num_preemptions", "Requests preempted to free KV cache.", M)
REQUEST_SUCCESS = Counter(
    "spyglass:request_success",
    "Finished requests by finish reason (stop, length, abort, error).",
    M + ["finished_reason"],
)
LORA_REQUESTS_ACTIVE = Gauge(
    "spyglass:lora_requests_active",
    "Live requests (waiting or running) per LoRA adapter.",
    M + ["lora_name"],
)
LORA_REQUEST_SUCCESS = Counter(
    "spyglass:lora_request_success",
    "Finished requests per LoRA adapter and finish reason.",
    M + ["lora_name", "finished_reason"],
)
LORA_GENERATION_TOKENS = Counter(
    "spyglass:lora_generation_tokens",
    "Tokens generated per LoRA adapter (counted when a request finishes).",
    M + ["lora_name"],
)
LORA_REQUESTS_INFO = Gauge(
    "spyglass:lora_requests_info",
    "vLLM's LoRA info series for adapter-aware routers: the adapters of running and waiting requests "
    "(comma-separated) as labels, the time of the last step as the value.",
    M + ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
)
PREFIX_CACHE_QUERIES = Counter(
    "spyglass:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", M
)
PREFIX_CACHE_HITS = Counter(
    "spyglass:prefix_cache_hits", "Prompt tokens found in the prefix cache.", M
)
SPEC_DECODE_NUM_DRAFTS = Counter("spyglass:spec_decode_num_drafts", "Draft proposals verified.", M)
SPEC_DECODE_NUM_DRAFT_TOKENS = Counter(
    "spyglass:spec_decode_num_draft_tokens", "Draft tokens proposed.", M
)
SPEC_DECODE_NUM_ACCEPTED_TOKENS = Counter(
    "spyglass:spec_decode_num_accepted_tokens", "Draft tokens accepted.", M
)
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = Counter(
    "spyglass:spec_decode_num_accepted_tokens_per_pos",
    "Draft tokens accepted, by position in the draft.",
    M + ["position"],
)
PLUGIN_HOOK_ERRORS = Counter(
    "spyglass:plugin_hook_errors",
    "Exceptions raised by plugin event hooks (logged, never fatal).",
    M + ["plugin", "hook"],
)

# -- structured outputs (grammar-constrained decoding) --------------------------------------------
GRAMMAR_SECONDS_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
STRUCTURED_OUTPUT_COMPILE_TIME = Histogram(
    "spyglass:structured_output_compile_seconds",
    "Compiling (and validating) one structured-output grammar: once per distinct spec, later requests hit the cache.",
    M,
    buckets=GRAMMAR_SECONDS_BUCKETS,
)
STRUCTURED_OUTPUT_MASK_TIME = Histogram(
    "spyglass:structured_output_mask_seconds",
    "Per step with constrained requests: filling their grammar bitmasks (part of the model phase).",
    M,
    buckets=GRAMMAR_SECONDS_BUCKETS,
)
VISION_ENCODER_TIME = Histogram(
    "spyglass:vision_encoder_seconds",
    "Per step that encodes images (a vision model's): running the vision tower and projector on "
    "them (part of the model phase; on a GPU, queueing it).",
    M,
    buckets=GRAMMAR_SECONDS_BUCKETS,
)
IMAGES_ENCODED = Counter(
    "spyglass:images_encoded",
    "Images a vision model's tower encoded (a request preempted and recomputed encodes its "
    "images again).",
    M,
)

IMAGE_CACHE_HITS = Counter(
    "spyglass:image_cache_hits",
    "Requests' images a vision model's steps read without running the tower: from the cache of "
    "recently encoded images (--image-cache-tokens), or encoded in the same step for another "
    "request.",
    M,
)
STEPS_SCHEDULED_AHEAD = Counter(
    "spyglass:engine_steps_scheduled_ahead",
    "Engine steps scheduled and launched while the step before was still on the device (async "
    "scheduling): against spyglass:engine_step_duration_seconds_count, the share of steps whose "
    "host work hid behind the device's. A step planned while none was in flight (async "
    "scheduling off, or after the engine was idle) is not.",
    M,
)
ENGINE_STEP_FORWARDS = Counter(
    "spyglass:engine_step_forwards",
    "Engine steps by how their forward ran: eager, or replaying a CUDA graph of one new token per "
    "request (graph_decode), of a few per request padded alike (graph_padded: verify steps, short "
    "prompts) or of a prompt chunk among decodes (graph_packed, --cuda-graph-tokens).",
    M + ["forward"],
)
CUDA_GRAPH_TOKENS = Counter(
    "spyglass:cuda_graph_tokens",
    "Rows the replayed CUDA graphs computed, padding included.",
    M,
)
CUDA_GRAPH_PADDING_TOKENS = Counter(
    "spyglass:cuda_graph_padding_tokens",
    "Of spyglass:cuda_graph_tokens, the padding rows: the rows of the smallest captured graph that "
    "held a step, past the step's own tokens.",
    M,
)
IMAGE_CHUNK_WAITS = Counter(
    "spyglass:image_chunk_waits",
    "Prompt chunks of a model whose image tokens attend to their whole image (Gemma 3) stopped "
    "before an image the step's token budget could not finish: its tokens wait for a later step.",
    M,
)

# -- per-request histograms (observed when a request finishes; latencies carry trace exemplars) --
TIME_TO_FIRST_TOKEN = Histogram(
    "spyglass:time_to_first_token_seconds",
    "Arrival to first output token.",
    M,
    buckets=TTFT_BUCKETS,
)
INTER_TOKEN_LATENCY = CountedHistogram(
    "spyglass:inter_token_latency_seconds",
    "Time between consecutive output tokens.",
    M,
    buckets=TOKEN_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "spyglass:request_time_per_output_token_seconds",
    "Mean decode time per output token after the first.",
    M,
    buckets=TOKEN_LATENCY_BUCKETS,
)
E2E_REQUEST_LATENCY = Histogram(
    "spyglass:e2e_request_latency_seconds", "Arrival to finish.", M, buckets=REQUEST_LATENCY_BUCKETS
)
REQUEST_PREPROCESS_TIME = Histogram(
    "spyglass:request_preprocess_seconds",
    "Per HTTP call: its handling before the engine had it (reading the body, rendering the chat "
    "template, tokenizing, fetching, decoding and resizing images); not part of arrival to "
    "finish.",
    M,
    buckets=REQUEST_LATENCY_BUCKETS,
)
REQUEST_QUEUE_TIME = Histogram(
    "spyglass:request_queue_time_seconds",
    "Arrival to first scheduled.",
    M,
    buckets=REQUEST_LATENCY_BUCKETS,
)
REQUEST_PREFILL_TIME = Histogram(
    "spyglass:request_prefill_time_seconds",
    "First scheduled to first token.",
    M,
    buckets=REQUEST_LATENCY_BUCKETS,
)
REQUEST_DECODE_TIME = Histogram(
    "spyglass:request_decode_time_seconds",
    "First token to last token.",
    M,
    buckets=REQUEST_LATENCY_BUCKETS,
)
REQUEST_PROMPT_TOKENS = Histogram(
    "spyglass:request_prompt_tokens",
    "Prompt length of finished requests.",
    M,
    buckets=TOKEN_COUNT_BUCKETS,
)
REQUEST_GENERATION_TOKENS = Histogram(
    "spyglass:request_generation_tokens",
    "Output length of finished requests.",
    M,
    buckets=TOKEN_COUNT_BUCKETS,
)
REQUEST_NUM_PREEMPTIONS = Histogram(
    "spyglass:request_num_preemptions",
    "Preemptions per finished request.",
    M,
    buckets=(0, 1, 2, 4, 8, 16),
)
REQUEST_INFERENCE_TIME = Histogram(
    "spyglass:request_inference_time_seconds",
    "First scheduled to finish (prefill and decode, preemptions included).",
    M,
    buckets=REQUEST_LATENCY_BUCKETS,
)
REQUEST_PARAMS_N = Histogram(
    "spyglass:request_params_n",
    "The n parameter of each API call (choices asked for).",
    M,
    buckets=(1, 2, 5, 10, 20),
)
REQUEST_PARAMS_MAX_TOKENS = Histogram(
    "spyglass:request_params_max_tokens",
    "The max_tokens limit of finished requests (the context room when the client set none).",
    M,
    buckets=TOKEN_COUNT_BUCKETS,
)
REQUEST_MAX_NUM_GENERATION_TOKENS = Histogram(
    "spyglass:request_max_num_generation_tokens",
    "The longest output among the choices of each API call.",
    M,
    buckets=TOKEN_COUNT_BUCKETS,
)

# -- per-step histograms -----------------------------------------------------------------------
# vLLM calls this histogram ``iteration_tokens_total``, which Prometheus reserves for counters;
# the vllm namespace (telemetry/exposition.py) restores vLLM's name.
ITERATION_TOKENS = Histogram(
    "spyglass:iteration_tokens", "Tokens scheduled per engine step.", M, buckets=STEP_TOKEN_BUCKETS
)
ENGINE_STEP_DURATION = Histogram(
    "spyglass:engine_step_duration_seconds",
    "Wall time of one engine step (schedule, model, update).",
    M,
    buckets=STEP_DURATION_BUCKETS,
)
ENGINE_STEP_PHASE_DURATION = Histogram(
    "spyglass:engine_step_phase_duration_seconds",
    "Wall time of each step phase (schedule, model, update).",
    M + ["phase"],
    buckets=STEP_DURATION_BUCKETS,
)
ENGINE_STEP_BATCH_SIZE = Histogram(
    "spyglass:engine_step_batch_size",
    "Requests in each step's batch.",
    M,
    buckets=BATCH_SIZE_BUCKETS,
)

# -- configuration ----------------------------------------------------------------------------
CACHE_CONFIG_INFO = Gauge(
    "spyglass:cache_config_info",
    "The KV cache's configuration in labels (vLLM's names); the value is always 1.",
    M + ["block_size", "num_gpu_blocks", "cache_dtype", "max_model_len", "max_num_seqs"],
)

ENGINE_CONFIG_INFO = Gauge(
    "spyglass:engine_config_info",
    "How the engine runs, in labels: device, dtype, kernels (the CPU instruction set, e.g. "
    "avx512-bf16+amx, or cuda), quantization mode, async output and async scheduling (on/off), "
    "the tasks the model answers (generate, embed, classify; joined by +) and how embeddings "
    "pool the prompt; the value is always 1.",
    M
    + [
        "device",
        "dtype",
        "kernels",
        "quantization",
        "async_output",
        "async_scheduling",
        "tasks",
        "pooling_type",
    ],
)

# -- service-level objectives ------------------------------------------------------------------
SLO_TTFT_TARGET = Gauge("spyglass:slo_ttft_target_seconds", "The time-to-first-token target.", M)
SLO_TPOT_TARGET = Gauge("spyglass:slo_tpot_target_seconds", "The time-per-output-token target.", M)
SLO_REQUESTS = Counter(
    "spyglass:slo_requests", "Finished requests judged against the SLOs (aborts excluded).", M
)
SLO_TTFT_MET = Counter("spyglass:slo_ttft_met_requests", "Requests whose TTFT met its target.", M)
SLO_TPOT_MET = Counter("spyglass:slo_tpot_met_requests", "Requests whose TPOT met its target.", M)
SLO_MET = Counter("spyglass:slo_met_requests", "Requests that met both targets (goodput).", M)
SLO_DEADLINE_MISSES = Counter(
    "spyglass:slo_deadline_misses",
    "Requests whose first token missed its deadline under the slo scheduling policy.",
    M,
)

# -- OpenTelemetry GenAI server metrics --------------------------------------------------------
GEN_AI = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "engine"]
GEN_AI_TIME_TO_FIRST_TOKEN = Histogram(
    "gen_ai_server_time_to_first_token_seconds",
    "gen_ai.server.time_to_first_token",
    GEN_AI,
    buckets=GEN_AI_TTFT_BUCKETS,
)
GEN_AI_TIME_PER_OUTPUT_TOKEN = Histogram(
    "gen_ai_server_time_per_output_token_seconds",
    "gen_ai.server.time_per_output_token",
    GEN_AI,
    buckets=GEN_AI_TPOT_BUCKETS,
)
GEN_AI_REQUEST_DURATION = Histogram(
    "gen_ai_server_request_duration_seconds",
    "gen_ai.server.request.duration",
    GEN_AI + ["error_type"],
    buckets=GEN_AI_DURATION_BUCKETS,
)

# -- HTTP ------------------------------------------------------------------------------------
HTTP_REQUESTS = Counter(
    "spyglass:http_requests", "HTTP requests by route template and status.", ["route", "status"]
)
HTTP_ERRORS = Counter(
    "spyglass:http_errors",
    "HTTP error responses by route template, status and the error's code (none without one): "
    "unsupported_parameter and unknown_parameter count calls that sent a field this server refuses "
    "(the access log and the span name the field).",
    ["route", "status", "code"],
)
TOOL_CALLS = Counter(
    "spyglass:tool_calls",
    "Tool calls returned to clients, by the format they were read in: the --tool-call-parser "
    "format (hermes, llama3_json, mistral, qwen3_coder, pythonic, phi4_mini_json, or a plugin's) "
    "for tool_choice "
    "auto, json for required and named calls, which the grammar writes. A rate of zero beside "
    "tool requests means the model's calls are not being read.",
    ["format"],
)
REPLICA_ROUTES = Counter(
    "spyglass:replica_routes",
    "Requests the replica router (spyglass serve --replicas) sent on, by why it chose their "
    "replica: kept_response (the one keeping the Responses API response the call continues or "
    "names), prefix (one that was sent part of the prompt's prefix, so it likely has its KV "
    "blocks cached), load (the shorter queue of two). Exported by the ingress's /metrics.",
    ["reason"],
)
RESPONSES_KEPT = Gauge(
    "spyglass:responses_kept",
    "Responses API responses the server keeps in memory for previous_response_id and GET "
    "/v1/responses/{id} (the last --responses-store-size; each holds its conversation).",
)
CHAT_COMPLETIONS_KEPT = Gauge(
    "spyglass:chat_completions_kept",
    "Chat completions made with store: true that the server keeps in memory for GET "
    "/v1/chat/completions (the last --chat-completions-store-size; each holds its messages and "
    "answer).",
)
CONVERSATIONS_KEPT = Gauge(
    "spyglass:conversations_kept",
    "Conversations (POST /v1/conversations) the server keeps in memory, each with its items, "
    "for Responses API calls that continue them (the last --conversations-store-size used).",
)
FILES_KEPT = Gauge(
    "spyglass:files_kept",
    "Files the server keeps in memory for OpenAI's batches: uploaded batch inputs, and the output "
    "and error files batches wrote (the last --batches-store-size).",
)
BATCHES_RUNNING = Gauge(
    "spyglass:batches_running",
    "OpenAI batches (POST /v1/batches) whose lines are being answered now; each sends at most 64 "
    "calls at once through the API, and its calls' spans carry spyglass.request.batch_id.",
)
RESPONSES_IN_BACKGROUND = Gauge(
    "spyglass:responses_in_background",
    "Responses API calls made with background: true whose answer is being generated now "
    "(each an engine request no client connection waits on; POST /v1/responses/{id}/cancel "
    "stops one).",
)
HTTP_REQUEST_DURATION = Histogram(
    "spyglass:http_request_duration_seconds",
    "HTTP request handling time (until the response ends).",
    ["route"],
    buckets=REQUEST_LATENCY_BUCKETS,
)
SERVER_CONFIG_INFO = Gauge(
    "spyglass:server_config_info",
    "How the HTTP server runs, in labels: engine_placement (thread: the engine steps in a thread "
    "of the server's process; process: in a process of its own, --engine-process), "
    "tool_call_parser (the format auto tool calls are read in, --tool-call-parser) and "
    "reasoning_parser (--reasoning-parser; none without); the value is always 1.",
    ["engine_placement", "tool_call_parser", "reasoning_parser"],
)
# Recorded by the HTTP server's process; every other metric by the engine's, which is another
# process with ``--engine-process`` (`exposition.MergedRegistry`).
SERVER_METRICS = (
    HTTP_REQUESTS,
    HTTP_ERRORS,
    TOOL_CALLS,
    RESPONSES_KEPT,
    CHAT_COMPLETIONS_KEPT,
    CONVERSATIONS_KEPT,
    FILES_KEPT,
    BATCHES_RUNNING,
    RESPONSES_IN_BACKGROUND,
    HTTP_REQUEST_DURATION,
    SERVER_CONFIG_INFO,
)


DEVICE_UTILIZATION = "spyglass:device_utilization_perc"
DEVICE_MEMORY_USED = "spyglass:device_memory_used_bytes"


class DeviceCollector(Collector):
    """Device utilisation read at scrape time: GPUs through NVML when available, else this process's CPU.

    ``spyglass:device_utilization_perc`` is 0..1 (for the CPU: process CPU time over wall time,
    divided by the usable cores, since the previous scrape); ``spyglass:device_memory_used_bytes``
    is GPU memory in use, or the process's resident memory.
    """

    def __init__(self) -> None:
        self._nvml_handles: list | None = None
        self._last_cpu = self._cpu_sample()  # the first scrape reports the average since start-up

    def _gpus(self) -> list:
        if self._nvml_handles is None:
            self._nvml_handles = []
            try:
                import pynvml
                import torch

                if torch.cuda.is_available():
                    pynvml.nvmlInit()
                    count = pynvml.nvmlDeviceGetCount()
                    self._nvml_handles = [
                        pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)
                    ]
            except Exception:
                self._nvml_handles = []
        return self._nvml_handles

    def collect(self):
        util = GaugeMetricFamily(
            DEVICE_UTILIZATION, "Device utilisation (0..1).", labels=["device"]
        )
        memory = GaugeMetricFamily(DEVICE_MEMORY_USED, "Device memory in use.", labels=["device"])
        gpus = self._gpus()
        if gpus:
            import pynvml

            for index, handle in enumerate(gpus):
                util.add_metric(
                    [f"cuda:{index}"], pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100
                )
                memory.add_metric([f"cuda:{index}"], pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        else:
            util.add_metric(["cpu"], self._cpu_utilization())
            memory.add_metric(["cpu"], _resident_bytes())
        yield util
        yield memory

    @staticmethod
    def _cpu_sample() -> tuple[float, float]:
        times = os.times()
        return times.user + times.system, time.monotonic()

    def _cpu_utilization(self) -> float:
        sample = self._cpu_sample()
        last, self._last_cpu = self._last_cpu, sample
        if sample[1] <= last[1]:
            return 0.0
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        return min(1.0, (sample[0] - last[0]) / (sample[1] - last[1]) / cores)

    def describe(self):
        return []


def _resident_bytes() -> float:
    try:
        import psutil

        return float(psutil.Process().memory_info().rss)
    except ImportError:
        import resource

        return float(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )  # peak, in KiB on Linux


DEVICE = DeviceCollector()
REGISTRY.register(DEVICE)


class EngineSeries:
    """The label children one engine records into, so that they can all be removed when it stops.

    The metric families above are shared definitions; the children (one per label set) belong to
    whoever created them. Plugins create their engine's children through `labels` and drop them
    with `remove` when the engine stops, so no stopped engine's series linger in the registry.
    """

    def __init__(self, model: str, engine: str):
        self.model = model
        self.engine = engine
        self._children: set[tuple[MetricWrapperBase, tuple[str, ...]]] = set()

    def labels(self, metric: MetricWrapperBase, *extra: str):
        """``metric``'s child for this engine (``model_name``, ``engine``, then ``extra`` labels)."""
        return self.child(metric, self.model, self.engine, *extra)

    def child(self, metric: MetricWrapperBase, *values: str):
        """``metric``'s child for exactly these label values (for families ordered otherwise, like GEN_AI)."""
        values = tuple(str(v) for v in values)
        self._children.add((metric, values))
        return metric.labels(*values)

    def forget(self, metric: MetricWrapperBase, *extra: str) -> None:
        """Remove this engine's child of ``metric`` with these ``extra`` labels (an info series
        whose labels moved on)."""
        values = (self.model, self.engine, *(str(v) for v in extra))
        if (metric, values) in self._children:
            metric.remove(*values)
            self._children.discard((metric, values))

    def remove(self, keep: tuple[MetricWrapperBase, ...] = ()) -> None:
        """Remove every child created here, except those of the metrics in ``keep``."""
        for metric, values in list(self._children):
            if metric not in keep:
                metric.remove(*values)
                self._children.discard((metric, values))
