"""CUDA graphs: the forward captured once per (batch bucket, rows per request), replayed with padded inputs.

A graph of shape (B, R) runs any step of at most B requests with at most R new tokens each: plain
decode (R = 1), decode with drafts to verify (R = 1 + the most drafts a request gets), or a short
prompt. Request ``i``'s new tokens go to rows ``i * R ...``; its padding rows come after them with slot
-1 (their keys and values are never stored) and its context length counts them, so each real row
keeps its position in the causal mask and never sees a padding row. Requests past the step's own
are all padding. Longer or larger steps run eagerly. A graph ends at the last layer's hidden states:
the final norm and the vocabulary head run after the replay on the sampled rows only, so no graph
holds a [tokens, vocabulary] output (gigabytes over every shape at a 128k vocabulary). Hooks and
telemetry run in the engine, outside the captured region. All graphs share one memory pool.
"""

import logging
import time

import torch

from spyglass.core.models.attention_metadata import AttentionMetadata

log = logging.getLogger("spyglass.cuda_graphs")


def batch_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 16 up to ``max_num_seqs`` (always included)."""
    buckets = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    buckets += list(range(16, max_num_seqs, 16))
    return sorted(set(buckets + [max_num_seqs]))


class CudaGraphDecoder:
    """Owns the static input buffers and one captured graph per (batch bucket, rows per request)."""

    def __init__(
        self,
        model,
        kv_caches,
        max_num_seqs: int,
        max_model_len: int,
        block_size: int,
        rows_per_request: tuple[int, ...] = (1,),
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.buckets = batch_buckets(max_num_seqs)
        self.rows_per_request = tuple(sorted(set(rows_per_request)))
        device = kv_caches[0][0].device
        size, most_rows = self.buckets[-1], self.rows_per_request[-1]
        # Padding rows extend a context past its last real position by up to most_rows - 1.
        # A fixed upper bound keeps the kernels' launch shapes identical at every replay.
        self.max_context_len = max_model_len + most_rows - 1
        max_blocks = -(-self.max_context_len // block_size)
        self.input_ids = torch.zeros(size * most_rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(size * most_rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((size * most_rows,), -1, dtype=torch.long, device=device)
        # Zeros, then only real block ids: whatever a padding row reads is a real block.
        self.block_tables = torch.zeros(size, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.full((size,), most_rows, dtype=torch.int32, device=device)
        self.query_start_locs = {
            rows: torch.arange(0, (size + 1) * rows, rows, dtype=torch.int32, device=device)
            for rows in self.rows_per_request
        }
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.hidden: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    def forward(self, batch: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's hidden states (and residual stream) over the static buffers of shape
        (``batch``, ``rows``): what a graph captures."""
        tokens = batch * rows
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:tokens],
            block_tables=self.block_tables[:batch],
            context_lens=self.context_lens[:batch],
            query_start_loc=self.query_start_locs[rows][: batch + 1],
            max_query_len=rows,
            max_context_len=self.max_context_len,
        )
        return self.model.hidden_states(
            self.input_ids[:tokens], self.positions[:tokens], meta, self.kv_caches
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every shape, largest first, into one shared pool."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        shapes = [(b, r) for b in self.buckets for r in self.rows_per_request]
        for shape in sorted(shapes, key=lambda s: s[0] * s[1], reverse=True):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(*shape)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.hidden[shape] = self.forward(*shape)
            self.graphs[shape] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d CUDA graphs (batch sizes %s x rows per request %s) in %.2f s",
            len(self.graphs),
            self.buckets,
            list(self.rows_per_request),
            self.capture_seconds,
        )

    def shape_for(self, num_reqs: int, max_query_len: int) -> tuple[int, int] | None:
        """The smallest captured (batch, rows) that holds the step, or None when it runs eagerly."""
        if num_reqs > self.buckets[-1] or max_query_len > self.rows_per_request[-1]:
            return None
        batch = next(b for b in self.buckets if b >= num_reqs)
        return batch, next(r for r in self.rows_per_request if r >= max_query_len)

    def load(
        self,
        shape: tuple[int, int],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor | slice:
        """Copy a step into the static buffers of ``shape``, padded; the rows of the graph's output
        that ``logits_indices`` (indices into the step's own tokens) became."""
        batch, rows = shape
        num_reqs, width = meta.block_tables.shape
        tokens = batch * rows
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

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Replay the smallest graph that holds the step; the logits of ``logits_indices``."""
        shape = self.shape_for(meta.block_tables.shape[0], meta.max_query_len)
        rows = self.load(shape, input_ids, positions, meta, logits_indices)
        return self.model.logits(*self._replay(shape), rows)

    def _replay(self, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the graph of ``shape`` on what the static buffers hold; its hidden states and residual."""
        self.graphs[shape].replay()
        return self.hidden[shape]
