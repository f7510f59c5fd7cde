"""Runs one step: flattens the scheduled requests into model inputs, runs the model, samples."""

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from spyglass.core.engine.kv.host_memory import (
    huge_pages_fault_without_stalls,
    zeros_in_fresh_mapping,
)
from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.runner.block_table_rows import BlockTableRows
from spyglass.core.engine.runner.cuda_graphs import CudaGraphDecoder, GraphShape
from spyglass.core.engine.runner.image_cache import EncodedImageCache
from spyglass.core.engine.runner.image_rows import step_image_rows
from spyglass.core.engine.runner.logprob_rows import LogprobRows, logprob_list
from spyglass.core.engine.runner.lora_rows import lora_groups
from spyglass.core.engine.runner.penalty_counts import PenaltyCounts, PendingTokens
from spyglass.core.engine.runner.pooling import (
    Pooled,
    PooledWork,
    PoolPart,
    PoolSlice,
    pool,
    pool_slices,
)
from spyglass.core.engine.runner.prompt_logprobs import PromptScores, score_prompts
from spyglass.core.engine.runner.row_tensors import per_row, to_pinned
from spyglass.core.engine.runner.step_inputs import StepInputs, build_step_inputs
from spyglass.core.engine.runner.step_sampling import sample_step
from spyglass.core.engine.sched.scheduler import ScheduledRequest, SchedulerOutput
from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.image_rows import ImageRows
from spyglass.core.models.lora import LoRABatch, attach_lora
from spyglass.core.models.registry import CausalLM

log = logging.getLogger("spyglass.engine")


class FatalRunnerError(RuntimeError):
    """The runner cannot run another step (a tensor-parallel rank died): the engine stops instead of
    failing only the step's requests."""


@dataclass(frozen=True, slots=True)
class VisionWork:
    """A vision model's step: how many images its vision tower encoded, the seconds that took
    (on a GPU, to queue it), and how many of its requests' images it read without running the
    tower (from the runner's `EncodedImageCache`, or shared within the step)."""

    num_images: int = 0
    seconds: float = 0.0
    num_images_cached: int = 0


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    """Sampled tokens per scheduled request (same order; empty for a prefill chunk that ends mid-prompt)."""

    sampled_token_ids: tuple[list[int], ...]
    logprobs: tuple[Sequence[Logprob | None], ...]
    model_time: float
    mask_time: float = 0.0
    """Of ``model_time``, the seconds spent filling structured-output bitmasks (0 without constraints)."""
    prompt_logprobs: tuple[list[Logprob], ...] = ()
    """Per scheduled request, the logprobs of the prompt tokens this step scored (empty when the
    step scores none)."""
    pooled: tuple[Pooled, ...] = ()
    """Per scheduled request, the answer of a pooling request whose prompt the step finished
    (an embedding or class probabilities), else None (empty when the step finishes none)."""
    pool_parts: tuple[PoolPart | None, ...] = ()
    """Per scheduled request, what the step adds to a pooling request's sum when it computed
    some of the positions it pools without finishing its prompt (empty when none)."""
    vision: VisionWork = VisionWork()
    """The images the step encoded (none for a model that reads no images)."""
    graph: GraphShape | None = None
    """The CUDA graph the step's forward replayed (None: it ran eagerly)."""


_NO_LOGPROB = (None,)
"""The logprobs of a sampled token that nobody asked logprobs for."""


@dataclass(frozen=True, slots=True)
class UnsampledStep:
    """A step whose forward is queued and whose sampling waits (`ModelRunner.sample_deferred`): a
    grammar's next mask needs the token its request sampled in the step in flight, accepted on the
    host. What sampling it reads of the forward."""

    out: SchedulerOutput
    inputs: StepInputs
    logits: torch.Tensor
    pooled: PooledWork
    vision: VisionWork
    graph: GraphShape | None


@dataclass(frozen=True, slots=True)
class LaunchedStep:
    """A step queued on the device (`ModelRunner.launch`); `ModelRunner.collect` gives its output."""

    start: float
    sampled_rows: tuple[bool, ...]
    token_ids: torch.Tensor | None = None
    """The sampled requests' token ids, in order (on the host, still being copied on a GPU)."""
    device_token_ids: torch.Tensor | None = None
    """The same ids on the device: where a step launched after this one reads its pending tokens."""
    sampled_req_ids: tuple[str, ...] = ()
    """The ids of the requests ``token_ids`` belongs to, in order."""
    copied: "torch.cuda.Event | None" = None
    """Recorded after the copy to the host: what `collect` waits for."""
    mask_time: float = 0.0
    vision: VisionWork = VisionWork()
    graph: GraphShape | None = None
    pooled: PooledWork = field(default_factory=PooledWork)
    """The step's pooled answers (on the host, still being copied on a GPU) and sums."""
    logprobs: LogprobRows | None = None
    """The sampled tokens' logprobs, for the requests that ask (on the host, still being copied on
    a GPU)."""
    prompt_scores: PromptScores | None = None
    """The scores of the prompt tokens the step scored, for the requests that ask (on the host,
    still being copied on a GPU)."""
    unsampled: UnsampledStep | None = None
    """A step launched ahead that samples a grammar's token: its forward, to sample once the step
    in flight is committed (`ModelRunner.sample_deferred`); then nothing else is set."""


class ModelRunner:
    """Owns the model weights and the KV cache tensors, and what makes a step's inputs cheap to
    build from the last step's: the block tables' rows and the penalised requests' token histories."""

    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        cache_dtype: torch.dtype,
    ):
        self.model = model
        self.device = device
        self.block_size = block_size
        self.table_rows = BlockTableRows()
        self.penalties = PenaltyCounts()
        arch = model.arch
        shape = model.backend.cache_shape(
            num_blocks, block_size, arch.num_key_value_heads, arch.head_dim
        )
        if device.type == "cpu":
            log.info(
                "KV cache on the CPU: huge pages %s",
                "advised"
                if huge_pages_fault_without_stalls()
                else "not advised (THP off, or its defrag setting would stall faults)",
            )
        # Zeroed, not empty: a padded read of a never-written slot must not bring NaN into a masked sum.
        self.kv_caches = [
            (self._zeros(shape, cache_dtype), self._zeros(shape, cache_dtype))
            for _ in range(arch.num_hidden_layers)
        ]
        self.num_blocks = num_blocks
        # Set by `enable_cuda_graphs`; None means every step runs eagerly.
        self.graphs: CudaGraphDecoder | None = None
        # Set by `enable_lora`: the rows of the step running that use each adapter.
        self.lora: LoRABatch | None = None
        # The images the step being launched encoded, and the graph its forward replayed (None:
        # eager); `_run_model` sets both.
        self._vision = VisionWork()
        self._graph: GraphShape | None = None
        # Images recently encoded, for other requests with the same image (`enable_image_cache`).
        self.image_cache = EncodedImageCache(0)

    def enable_image_cache(self, max_tokens: int) -> None:
        """Keep up to ``max_tokens`` embeddings of recently encoded images (a vision model's)."""
        self.image_cache = EncodedImageCache(max_tokens)

    def enable_lora(self) -> LoRABatch:
        """Wrap the model's projections for LoRA adapters (`core.models.lora.attach_lora`)."""
        self.lora = attach_lora(self.model)
        return self.lora

    def compile_kernels(self, max_num_batched_tokens: int, max_model_len: int) -> float:
        """Run one step of every shape that has its own compiled kernel variant, so that serving
        compiles nothing; the seconds it took (0 for kernels not compiled on first use).

        Triton compiles a kernel the first time it meets a new combination of compile-time
        constants, which stalls every running request for a second or more. The backend names the
        query lengths and the decode context that reach them all; a prefill of the whole token
        budget adds the MoE kernels' large tile. The steps write only the KV slots of blocks that
        no request holds yet.
        """
        shapes = self.model.backend.warm_up_shapes
        if shapes is None:
            return 0.0
        start = time.perf_counter()
        query_lengths, split_context = shapes()
        capacity = min(max_model_len, self.num_blocks * self.block_size)
        for length in sorted({*query_lengths, max_num_batched_tokens}):
            if length <= capacity:
                self._dummy_step(length, length)
        if split_context <= capacity:
            self._dummy_step(1, split_context)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    @torch.inference_mode()
    def _dummy_step(self, query_len: int, context_len: int) -> None:
        """The forward of one request whose last ``query_len`` of ``context_len`` tokens are new,
        its context in blocks 0, 1, ... (token ids 0)."""
        to = self.device
        positions = torch.arange(context_len - query_len, context_len, device=to)
        num_pages = -(-context_len // self.block_size)
        meta = AttentionMetadata(
            slot_mapping=positions.clone(),  # page p is block p, so a position is its own slot
            block_tables=torch.arange(num_pages, dtype=torch.int32, device=to)[None],
            context_lens=torch.tensor([context_len], dtype=torch.int32, device=to),
            query_start_loc=torch.tensor([0, query_len], dtype=torch.int32, device=to),
            max_query_len=query_len,
            max_context_len=context_len,
        )
        input_ids = torch.zeros(query_len, dtype=torch.long, device=to)
        last = torch.tensor([query_len - 1], device=to)
        self.model.forward(input_ids, positions, meta, self.kv_caches, last)

    def enable_cuda_graphs(
        self,
        max_num_seqs: int,
        max_model_len: int,
        rows_per_request: tuple[int, ...] = (1,),
        token_buckets: tuple[int, ...] = (),
    ) -> float:
        """Capture graphs for every batch bucket and each count of new tokens per request in
        ``rows_per_request`` (1 for decode, 1 + drafts for verify steps), and packed graphs of each
        token count in ``token_buckets`` (prompt chunks among decodes); the capture time in seconds."""
        self.graphs = CudaGraphDecoder(
            self.model,
            self.kv_caches,
            max_num_seqs,
            max_model_len,
            self.block_size,
            rows_per_request,
            token_buckets,
        )
        self.graphs.capture()
        return self.graphs.capture_seconds

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            return zeros_in_fresh_mapping(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    @staticmethod
    def bytes_per_block(arch, block_size: int, dtype: torch.dtype) -> int:
        """KV cache bytes one block costs across all layers, keys and values."""
        element_size = torch.empty((), dtype=dtype).element_size()
        return (
            2
            * arch.num_hidden_layers
            * block_size
            * arch.num_key_value_heads
            * arch.head_dim
            * element_size
        )

    def prepare(
        self,
        out: SchedulerOutput,
        block_tables: dict[str, list[int]],
        after: LaunchedStep | None = None,
    ) -> StepInputs:
        """The step's model inputs on this runner's device (`build_step_inputs`)."""
        return build_step_inputs(
            out, block_tables, self.table_rows, self.block_size, self.device, after
        )

    @torch.inference_mode()
    def launch(
        self,
        out: SchedulerOutput,
        block_tables: dict[str, list[int]],
        after: LaunchedStep | None = None,
    ) -> LaunchedStep:
        """Queue a non-empty step's forward and sampling on the device; `collect` waits for it.

        The step samples (and verifies drafts), scores prompt tokens and pools on the device, and
        starts copying the token ids (and the logprobs, scores and pooled answers asked for) to the
        host: on a GPU the host returns before the step has run.
        ``after`` is the step still in flight whose sampled ids this one's pending tokens are
        (async scheduling). A step where a grammar's request has a token pending is only
        forwarded: `sample_deferred` samples it once ``after`` is committed.
        """
        start = time.perf_counter()
        inputs = self.prepare(out, block_tables, after)
        slices = pool_slices(out.scheduled, inputs.sampled_rows)
        in_flight = {} if after is None else after.pooled.sums
        logits, pooled = self._run_model(out, inputs, slices, in_flight)
        if logits is None:  # only pooling: each pooled row's token (never kept) is a 0
            pooled = pooled.to_host()
            zeros = torch.zeros(sum(inputs.sampled_rows), dtype=torch.long)
            copied = _copy_event(self.device)
            return LaunchedStep(
                start, inputs.sampled_rows, zeros, copied=copied, vision=self._vision, pooled=pooled
            )
        unsampled = UnsampledStep(out, inputs, logits, pooled, self._vision, self._graph)
        sampled = [s for s, is_sampled in zip(out.scheduled, inputs.sampled_rows) if is_sampled]
        if after is not None and any(
            s.request.constraint and s.request.num_pending_tokens for s in sampled
        ):
            return LaunchedStep(start, inputs.sampled_rows, unsampled=unsampled)
        return self._sample(start, unsampled, sampled, _pending_read(sampled, after))

    @torch.inference_mode()
    def sample_deferred(self, launched: LaunchedStep) -> LaunchedStep:
        """Sample a step whose sampling waited for the commit of the step in flight before it (its
        grammars have accepted their pending tokens, all now on the host): as `launch` does."""
        unsampled = launched.unsampled
        rows = unsampled.inputs.sampled_rows
        sampled = [s for s, is_sampled in zip(unsampled.out.scheduled, rows) if is_sampled]
        return self._sample(launched.start, unsampled, sampled, None)

    def _sample(
        self,
        start: float,
        step: UnsampledStep,
        sampled: list[ScheduledRequest],
        pending: PendingTokens | None,
    ) -> LaunchedStep:
        """Sample a step whose logits are computed (or queued) on the device (`sample_step`),
        score its prompt rows there (`score_prompts`), and start copying both (and the step's
        pooled answers) to the host."""
        out, inputs, logits = step.out, step.inputs, step.logits
        num_sampled = logits.shape[0] - sum(inputs.prompt_rows)
        tokens = sample_step(logits[:num_sampled], sampled, self.penalties, pending)
        scores = score_prompts(out, inputs.prompt_rows, inputs.prompt_targets, logits[num_sampled:])
        token_ids, logprobs, pooled = tokens.token_ids, tokens.logprobs, step.pooled
        host = token_ids
        if token_ids.device.type != "cpu":
            host = to_pinned(token_ids)
            logprobs = None if logprobs is None else logprobs.to_host()
            scores = None if scores is None else scores.to_host()
            pooled = pooled.to_host()
        return LaunchedStep(
            start,
            inputs.sampled_rows,
            host,
            # A step with drafts is never one that a step launched after it reads (speculation
            # does not schedule ahead).
            device_token_ids=token_ids if token_ids.dim() == 1 else None,
            sampled_req_ids=tuple(s.request.req_id for s in sampled),
            copied=_copy_event(self.device),
            mask_time=tokens.mask_time,
            vision=step.vision,
            graph=step.graph,
            logprobs=logprobs,
            prompt_scores=scores,
            pooled=pooled,
        )

    def collect(self, launched: LaunchedStep) -> RunnerOutput:
        """Wait for a launched step's token ids; its output."""
        if launched.copied is not None:
            launched.copied.synchronize()
        tokens, logprobs = _per_request(
            launched.token_ids, launched.logprobs, launched.sampled_rows
        )
        scores, pooled = launched.prompt_scores, launched.pooled
        return RunnerOutput(
            tokens,
            logprobs,
            time.perf_counter() - launched.start,
            launched.mask_time,
            () if scores is None else scores.logprobs(),
            () if pooled.answers is None else pooled.answers.answers(),
            pooled.parts,
            launched.vision,
            launched.graph,
        )

    def _run_model(
        self,
        out: SchedulerOutput,
        inputs: StepInputs,
        slices: list[PoolSlice],
        in_flight: Mapping[str, torch.Tensor],
    ) -> tuple[torch.Tensor | None, PooledWork]:
        """The logits of ``inputs.logits_indices``, and the pooling requests' answers and parts
        (`pooling.pool`, which adds the ``in_flight`` step's sums; eager, from the same forward),
        each LoRA row with its adapter's delta and each image token with its image's embedding.
        No logits (None) when every row is that of a pooling request the step answers: the LM
        head is not run (a base model or a classifier has none)."""
        if self.lora is not None:
            self.lora.groups = lora_groups(out.scheduled, self.device)
        images, self._vision, self._graph = None, VisionWork(), None
        try:
            if self.model.arch.vision is not None:
                start = time.perf_counter()
                images, encoded, cached = step_image_rows(
                    out.scheduled, self.model.encode_images, self.image_cache
                )
                seconds = time.perf_counter() - start if encoded else 0.0
                self._vision = VisionWork(encoded, seconds, cached)
                if images is not None and self.model.arch.vision.bidirectional:
                    ends = images.visible_ends(inputs.positions)
                    inputs = replace(inputs, meta=replace(inputs.meta, visible_ends=ends))
            if not slices:
                return self._forward(inputs, len(out.scheduled), images), PooledWork()
            hidden, residual = self._hidden_states(inputs, images)
            pooled_rows = [row for piece in slices for row in piece.rows]
            final = hidden.new_zeros((0, hidden.shape[-1]))
            if pooled_rows:
                where = per_row(pooled_rows, torch.long, self.device)
                final = self.model.final_hidden(hidden, residual, where)
            # Read only when a request classifies: families without classifiers have no head.
            classify = lambda final_rows: self.model.classify(final_rows)
            pooled = pool(final, slices, out.scheduled, classify, in_flight)
            rows = inputs.logits_indices
            if sum(piece.finishes for piece in slices) == len(rows):
                return None, pooled
            return self.model.logits(hidden, residual, rows), pooled
        finally:
            if self.lora is not None:
                self.lora.groups = []

    def _hidden_states(
        self, inputs: StepInputs, images: ImageRows | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's `hidden_states` for the step (with its image tokens' embeddings, if any)."""
        args = (inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches)
        if images is None:
            return self.model.hidden_states(*args)
        return self.model.hidden_states(*args, images)

    def _forward(self, inputs: StepInputs, num_reqs: int, images: ImageRows | None) -> torch.Tensor:
        """The logits of ``inputs.logits_indices``: a captured graph's replay where one fits, else
        eager (always for a step with image tokens)."""
        # Graphs compute only the sampled rows' logits, and no adapter's delta.
        if images is not None:
            hidden, residual = self._hidden_states(inputs, images)
            return self.model.logits(hidden, residual, inputs.logits_indices)
        if self.graphs and not inputs.prompt_rows and not (self.lora and self.lora.groups):
            shape = self.graphs.shape_for(
                num_reqs, inputs.meta.max_query_len, len(inputs.input_ids)
            )
            if shape is not None:
                self._graph = shape
                return self.graphs.run(
                    shape, inputs.input_ids, inputs.positions, inputs.meta, inputs.logits_indices
                )
        return self.model.forward(
            inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches, inputs.logits_indices
        )

    def close(self) -> None:
        """Release what outlives the engine's objects (a tensor-parallel runner stops its workers)."""


def _per_request(
    token_ids: torch.Tensor, logprobs: LogprobRows | None, rows: tuple[bool, ...]
) -> tuple[tuple[list[int], ...], tuple[Sequence[Logprob | None], ...]]:
    """Per scheduled request (``rows``: whether it sampled), its tokens and their logprobs, from
    `SampledTokens` on the host: one id per sampled request, or a row of ids (-1 after its last)
    in a step with drafts."""
    ids = token_ids.tolist()
    if token_ids.dim() == 2:
        ids = [[t for t in row if t >= 0] for row in ids]
        first = [row[0] for row in ids]
        wanted = iter(logprob_list(logprobs, first, len(ids)))
        appended = iter(ids)
        tokens = tuple(next(appended) if is_sampled else [] for is_sampled in rows)
        lists = tuple(
            [next(wanted)] + [None] * (len(t) - 1) if is_sampled else []
            for t, is_sampled in zip(tokens, rows)
        )
        return tokens, lists
    if logprobs is not None:
        wanted = iter(logprob_list(logprobs, ids, len(ids)))
        sampled_ids = iter(ids)
        tokens = tuple([next(sampled_ids)] if is_sampled else [] for is_sampled in rows)
        return tokens, tuple([next(wanted)] if is_sampled else [] for is_sampled in rows)
    if len(ids) == len(rows):  # every request sampled (decode): no row to skip
        return tuple([token_id] for token_id in ids), (_NO_LOGPROB,) * len(rows)
    sampled_ids = iter(ids)
    tokens = tuple([next(sampled_ids)] if is_sampled else [] for is_sampled in rows)
    return tokens, tuple(_NO_LOGPROB if is_sampled else () for is_sampled in rows)


def _copy_event(device: torch.device) -> "torch.cuda.Event | None":
    """On a GPU, an event recorded behind the step's copies to the host, which `collect` waits
    for; None on the CPU, where they are done."""
    if device.type == "cpu":
        return None
    copied = torch.cuda.Event()
    copied.record()
    return copied


def _pending_read(
    sampled: list[ScheduledRequest], after: LaunchedStep | None
) -> PendingTokens | None:
    """The tokens ``after`` (the step in flight) sampled, for penalties to count and bad words to
    compare, when a request with either has one pending; else None."""
    if after is None or not any(
        s.request.num_pending_tokens
        and (s.request.sampling_params.has_penalties or s.request.bad_word_ids)
        for s in sampled
    ):
        return None
    index = {req_id: at for at, req_id in enumerate(after.sampled_req_ids)}
    return PendingTokens(after.device_token_ids, index)
