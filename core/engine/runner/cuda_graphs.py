"""CUDA-graph decode: the decode forward captured once per batch-size bucket, replayed with padded inputs.

Only decode-only steps (one new token per request, no drafts) within the largest bucket are
replayed; prefill, mixed and oversize steps run eagerly. Hooks and telemetry run in the engine,
outside the captured region. All buckets share one memory pool.
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
    """Owns the static input buffers and one captured graph per bucket."""

    def __init__(self, model, kv_caches, max_num_seqs: int, max_model_len: int, block_size: int):
        self.model = model
        self.kv_caches = kv_caches
        self.max_model_len = max_model_len
        self.buckets = batch_buckets(max_num_seqs)
        device = kv_caches[0][0].device
        size = self.buckets[-1]
        max_blocks = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((size,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(size, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(size + 1, dtype=torch.int32, device=device)
        self.logits_indices = torch.arange(size, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.capture_seconds = 0.0

    def _forward(self, batch: int) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch],
            block_tables=self.block_tables[:batch],
            context_lens=self.context_lens[:batch],
            query_start_loc=self.query_start_loc[: batch + 1],
            max_query_len=1,
            # A fixed upper bound keeps the kernels' launch shapes identical at every replay.
            max_context_len=self.max_model_len,
        )
        return self.model.forward(
            self.input_ids[:batch],
            self.positions[:batch],
            meta,
            self.kv_caches,
            self.logits_indices[:batch],
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up and capture every bucket, largest first, into one shared pool."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for batch in reversed(self.buckets):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._forward(batch)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch] = self._forward(batch)
            self.graphs[batch] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d CUDA graphs (batch sizes %s) in %.2f s",
            len(self.graphs),
            self.buckets,
            self.capture_seconds,
        )

    def can_run(self, num_reqs: int, num_tokens: int, max_query_len: int) -> bool:
        """True for a decode-only step that fits a captured bucket."""
        return max_query_len == 1 and num_tokens == num_reqs and num_reqs <= self.buckets[-1]

    def run(self, input_ids, positions, meta: AttentionMetadata) -> torch.Tensor:
        """Copy a decode step into the static buffers (padding the rest), replay, return its logits."""
        num_reqs = input_ids.shape[0]
        batch = next(b for b in self.buckets if b >= num_reqs)
        width = meta.block_tables.shape[1]
        self.input_ids[:num_reqs].copy_(input_ids)
        self.positions[:num_reqs].copy_(positions)
        self.slot_mapping[:num_reqs].copy_(meta.slot_mapping)
        self.slot_mapping[num_reqs:batch].fill_(-1)
        self.block_tables[:num_reqs, :width].copy_(meta.block_tables)
        self.context_lens[:num_reqs].copy_(meta.context_lens)
        self.context_lens[num_reqs:batch].fill_(1)
        self.graphs[batch].replay()
        return self.logits[batch][:num_reqs]
