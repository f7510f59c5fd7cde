"""CUDA graphs: the forward captured once per step shape, replayed with padded inputs.

A graph of shape (B, R) runs any step of at most B requests with at most R new tokens each: plain
decode (R = 1), decode with drafts to verify (R = 1 + the most drafts a request gets), or a short
prompt. Request ``i``'s new tokens go to rows ``i * R ...``; its padding rows come after them with slot
-1 (their keys and values are never stored) and its context length counts them, so each real row
keeps its position in the causal mask and never sees a padding row. Requests past the step's own
are all padding. A packed graph of T tokens (``token_buckets``) runs a step of other shapes (a
prompt chunk among decodes) of at most T new tokens and the most requests: its tokens as the step
has them, then padding rows with slot -1 that no request's queries reach, and requests past the
step's own with no new token. Longer steps run eagerly. A graph ends at the last layer's hidden states:
the final norm and the vocabulary head run after the replay on the sampled rows only, so no graph
holds a [tokens, vocabulary] output (gigabytes over every shape at a 128k vocabulary). Hooks and
telemetry run in the engine, outside the captured region. All graphs share one memory pool.
"""

import logging
import time
from dataclasses import dataclass

import torch

from spyglass.core.models.attention_metadata import AttentionMetadata

log = logging.getLogger("spyglass.cuda_graphs")


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 16 up to ``max_num_seqs`` (always included)."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    return sorted(set(buckets + [max_num_seqs]))


def token_buckets(max_tokens: int, max_num_batched_tokens: int) -> tuple[int, ...]:
    """Packed graphs' token counts: 32, 64, 128, ... up to ``max_tokens`` (never past the step
    budget, always including the last), none for 0."""
    largest = min(max_tokens, max_num_batched_tokens)
    if largest <= 0:
        return ()
    buckets = {32 << i for i in range(largest.bit_length()) if 32 << i < largest}
    return tuple(sorted(buckets | {largest}))


@dataclass(frozen=True, slots=True)
class GraphShape:
    """A captured step shape: ``batch`` requests of ``rows`` new tokens each, padded (``tokens`` is
    their product), or with ``rows`` 0 packed: at most ``tokens`` new tokens of at most ``batch``
    requests."""

    batch: int
    rows: int
    tokens: int

    @property
    def kind(self) -> str:
        """``decode`` (one row per request), ``padded`` (several: verify steps, short prompts) or
        ``packed``."""
        return "packed" if self.rows == 0 else "decode" if self.rows == 1 else "padded"


class CudaGraphDecoder:
    """Owns the static input buffers and one captured graph per `GraphShape`: each (batch bucket,
    rows per request), and each packed token count of ``token_buckets`` at the largest batch."""

    def __init__(
        self,
        model,
        kv_caches,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        rows_per_request: tuple[int, ...] = (1,),
        token_buckets: tuple[int, ...] = (),
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.buckets = batch_buckets(max_num_seqs)
        self.rows_per_request = tuple(sorted(set(rows_per_request)))
        self.token_buckets = tuple(sorted(set(token_buckets)))
        device = kv_caches[0][0].device
        size, most_rows = self.buckets[-1], self.rows_per_request[-1]
        # Padding rows extend a context past its last real position by up to most_rows - 1.
        # A fixed upper bound keeps the kernels' launch shapes identical at every replay.
        self.max_context_len = max_model_len + most_rows - 1
        max_blocks = -(-self.max_context_len // block_size)
        rows = max((size * most_rows, *self.token_buckets))
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.long, device=device)
        # Zeros, then only real block ids: whatever a padding row reads is a real block.
        self.block_tables = torch.zeros(size, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.full((size,), most_rows, dtype=torch.int32, device=device)
        self.query_start_locs = {
            rows: torch.arange(0, (size + 1) * rows, rows, dtype=torch.int32, device=device)
            for rows in self.rows_per_request
        }
        # A packed step's own query starts, then its last one for each request past its own.
        self.packed_starts = torch.zeros(size + 1, dtype=torch.int32, device=device)
        self.graphs: dict[GraphShape, torch.cuda.CUDAGraph] = {}
        self.hidden: dict[GraphShape, tuple[torch.Tensor, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    def forward(self, shape: GraphShape) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's hidden states (and residual stream) over the static buffers of ``shape``:
        what a graph captures. A packed shape's attention takes its longest query to be all its
        tokens, so the kernel chosen (and its grid) holds any step that fits."""
        batch, rows, tokens = shape.batch, shape.rows, shape.tokens
        starts = self.query_start_locs[rows] if rows else self.packed_starts
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:tokens],
            block_tables=self.block_tables[:batch],
            context_lens=self.context_lens[:batch],
            query_start_loc=starts[: batch + 1],
            max_query_len=rows or tokens,
            max_context_len=self.max_context_len,
        )
        return self.model.hidden_states(
            self.input_ids[:tokens], self.positions[:tokens], meta, self.kv_caches
        )

    @property
    def shapes(self) -> list[GraphShape]:
        """Every shape to capture: each (batch bucket, rows per request), then each packed count."""
        padded = [GraphShape(b, r, b * r) for b in self.buckets for r in self.rows_per_request]
        packed = [GraphShape(self.buckets[-1], 0, t) for t in self.token_buckets]
        return padded + packed

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every shape, largest first, into one shared pool."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for shape in sorted(self.shapes, key=lambda s: s.tokens, reverse=True):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(shape)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.hidden[shape] = self.forward(shape)
            self.graphs[shape] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d CUDA graphs (batch sizes %s x rows per request %s, packed tokens %s) "
            "in %.2f s",
            len(self.graphs),
            self.buckets,
            list(self.rows_per_request),
            list(self.token_buckets),
            self.capture_seconds,
        )

    def shape_for(self, num_reqs: int, max_query_len: int, num_tokens: int) -> GraphShape | None:
        """The smallest captured shape that holds the step: padded where its requests' new tokens
        fit a rows-per-request count, else packed where its tokens fit a count; None when it runs
        eagerly."""
        if num_reqs > self.buckets[-1]:
            return None
        if max_query_len <= self.rows_per_request[-1]:
            batch = next(b for b in self.buckets if b >= num_reqs)
            rows = next(r for r in self.rows_per_request if r >= max_query_len)
            return GraphShape(batch, rows, batch * rows)
        tokens = next((t for t in self.token_buckets if t >= num_tokens), None)
        return None if tokens is None else GraphShape(self.buckets[-1], 0, tokens)

    def load(
        self,
        shape: GraphShape,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor | slice:
        """Copy a step into the static buffers of ``shape``, padded; the rows of the graph's output
        that ``logits_indices`` (indices into the step's own tokens) became."""
        if shape.rows == 0:  # the step's own rows: its logits rows as they are
            self._load_packed(shape.batch, shape.tokens, input_ids, positions, meta)
            return logits_indices
        batch, rows, tokens = shape.batch, shape.rows, shape.tokens
        num_reqs, width = meta.block_tables.shape
        if rows == 1:  # one token per request: the step's rows are already the graph's
            self.input_ids[:num_reqs].copy_(input_ids)
            self.positions[:num_reqs].copy_(positions)
            self.slot_mapping[:num_reqs].copy_(meta.slot_mapping)
            self.slot_mapping[num_reqs:tokens].fill_(-1)
            self.context_lens[:num_reqs].copy_(meta.context_lens)
        else:
            starts = meta.query_start_loc
            query_lens = starts[1:] - starts[:-1]
            num_tokens = input_ids.shape[0]
            # Each token's request, and its index within the request's new tokens (no host sync).
            owner = torch.repeat_interleave(
                torch.arange(num_reqs, device=starts.device), query_lens, output_size=num_tokens
            )
            offset = torch.arange(num_tokens, device=starts.device) - starts[owner]
            padded_rows = owner * rows + offset
            self.slot_mapping[:tokens].fill_(-1)
            self.input_ids[padded_rows] = input_ids
            self.positions[padded_rows] = positions
            self.slot_mapping[padded_rows] = meta.slot_mapping
            self.context_lens[:num_reqs].copy_(meta.context_lens + (rows - query_lens))
        self.context_lens[num_reqs:batch].fill_(rows)
        self.block_tables[:num_reqs, :width].copy_(meta.block_tables)
        if rows > 1:
            return padded_rows[logits_indices]
        # Every request sampled (plain decode): the first rows as they are, without a gather.
        return slice(0, num_reqs) if logits_indices.shape[0] == num_reqs else logits_indices

    def _load_packed(
        self,
        batch: int,
        tokens: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        """`load` for a packed shape of ``batch`` requests and ``tokens`` rows: the step's rows as
        they are, then padding rows that no request's queries reach (slot -1), and requests past
        the step's own with none (their query start the step's end, their context empty)."""
        num_reqs, width = meta.block_tables.shape
        num_tokens = input_ids.shape[0]
        self.input_ids[:num_tokens].copy_(input_ids)
        self.positions[:num_tokens].copy_(positions)
        self.slot_mapping[:num_tokens].copy_(meta.slot_mapping)
        self.slot_mapping[num_tokens:tokens].fill_(-1)
        self.packed_starts[: num_reqs + 1].copy_(meta.query_start_loc)
        self.packed_starts[num_reqs + 1 :].fill_(num_tokens)
        self.context_lens[:num_reqs].copy_(meta.context_lens)
        self.context_lens[num_reqs:batch].fill_(0)
        self.block_tables[:num_reqs, :width].copy_(meta.block_tables)

    def run(
        self,
        shape: GraphShape,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Replay the graph of ``shape`` (`shape_for` the step); the logits of ``logits_indices``."""
        rows = self.load(shape, input_ids, positions, meta, logits_indices)
        return self.model.logits(*self._replay(shape), rows)

    def _replay(self, shape: GraphShape) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the graph of ``shape`` on what the static buffers hold; its hidden states and residual."""
        self.graphs[shape].replay()
        return self.hidden[shape]
