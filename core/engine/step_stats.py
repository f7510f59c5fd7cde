"""Frozen payloads the engine hands to hooks: what it runs, and what each step did."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spyglass.core.engine.answer_reading import ParserLookup
    from spyglass.core.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """The engine's identity and capacity, announced at start and stop."""

    model_name: str
    device: str
    dtype: str
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    attention_backend: str
    engine_id: str = (
        ""  # the engine's id (`EngineConfig.engine_id`), the ``engine`` label of its metrics
    )
    vocab_size: int = 0  # the width of the model's logits (token ids are below it)
    waiting_classes: tuple[str, ...] = ()  # the scheduling policy's classes known up front
    tensor_parallel_size: int = 1  # the ranks (processes) that run each forward
    kv_cache_dtype: str = ""  # the KV cache's dtype: `dtype` unless --kv-cache-dtype chose another
    kernels: str = ""  # the CPU instruction set the kernels use (avx2, avx512-bf16+amx...), or cuda
    quantization: str = ""  # the --quantization mode in force (auto, none, int8, dual)
    async_output: bool = False  # a step's outputs are emitted while the next step runs
    async_scheduling: bool = False  # a step is scheduled before the previous one's tokens are known
    stream_interval: int = 1  # tokens per streamed output at most (--stream-interval)
    tasks: tuple[str, ...] = ("generate", "embed")  # what the model answers (its head decides)
    pooling_type: str = "last"  # how embeddings pool the prompt (last, mean, cls)
    # Live views for plugins: the tokenizer (to decode output for traces), the hook relay's
    # error counts by "plugin.hook" (exported as a metric) and the parsers the engine's plugins
    # provide (to read an answer as the API does: `AnswerReading.read`). Not part of equality or
    # the repr.
    tokenizer: "Tokenizer | None" = field(default=None, compare=False, repr=False)
    hook_errors: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    parsers: "ParserLookup | None" = field(default=None, compare=False, repr=False)


STEP_FORWARDS = ("eager", "graph_decode", "graph_padded", "graph_packed")
"""The values of `StepStats.forward`."""


@dataclass(frozen=True, slots=True)
class StepStats:
    """One engine step: batch composition, tokens, timings (seconds) and the KV cache afterwards."""

    step_id: int
    req_ids: tuple[str, ...]
    num_prefill_reqs: int
    num_decode_reqs: int
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_generated_tokens: int
    num_preempted: int
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_free_blocks: int
    schedule_time: float
    model_time: float
    update_time: float
    start_time: float
    end_time: float
    waiting_by_class: tuple[tuple[str, int], ...] = ()
    mask_time: float = 0.0  # of model_time: filling structured-output (grammar) bitmasks
    num_images_encoded: int = 0  # images a vision model's tower encoded this step
    num_images_cached: int = 0  # requests' images read without the tower (cached or shared)
    vision_time: float = 0.0  # of model_time: encoding them (on a GPU, queueing the encoder)
    num_image_waits: int = 0  # prompt chunks stopped before an image they could not finish
    scheduled_ahead: bool = False  # launched while the step before was on the device
    tensor_parallel_size: int = 1  # the ranks (processes) that ran this step's forward
    # How the forward ran: "eager", or replaying a CUDA graph of one row per request
    # ("graph_decode"), of a few per request padded alike ("graph_padded": verify steps, short
    # prompts) or of a prompt chunk among decodes ("graph_packed"): `STEP_FORWARDS`.
    forward: str = "eager"
    graph_tokens: int = 0  # the rows the replayed graph computed, padding included (0 if eager)
