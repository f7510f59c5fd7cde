"""Each step's model inputs as two int64 tensors, for a broadcast from rank 0 to the workers.

A fixed-size header says what comes (a step, the KV cache's size, or stop) and how long each
field is; the payload is every input tensor flattened into one. Two broadcasts per step, no pickling.
"""

from dataclasses import dataclass

import torch

from spyglass.core.models.attention_metadata import AttentionMetadata

STEP, INIT, STOP = 1, 2, 3
HEADER_LEN = 16
# The payload's fields, in order; the header carries their lengths and dtypes (indexes into _DTYPES).
_FIELDS = (
    "input_ids",
    "positions",
    "slot_mapping",
    "block_tables",
    "context_lens",
    "query_start_loc",
    "logits_indices",
)
_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


@dataclass(frozen=True, slots=True)
class StepMessage:
    """One step's inputs as a worker rebuilds them (on its own device)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor


def header(command: int, *values: int) -> torch.Tensor:
    """A header for ``command`` with up to ``HEADER_LEN - 1`` integers after it."""
    out = torch.zeros(HEADER_LEN, dtype=torch.int64)
    out[: 1 + len(values)] = torch.tensor([command, *values], dtype=torch.int64)
    return out


def encode_step(
    input_ids, positions, meta: AttentionMetadata, logits_indices
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(header, payload)`` for one step's forward inputs (any device; the payload is on the CPU)."""
    tensors = (
        input_ids,
        positions,
        meta.slot_mapping,
        meta.block_tables,
        meta.context_lens,
        meta.query_start_loc,
        logits_indices,
    )
    num_reqs, width = meta.block_tables.shape
    sizes = (
        input_ids.numel(),
        num_reqs,
        width,
        logits_indices.numel(),
        meta.max_query_len,
        meta.max_context_len,
    )
    codes = [_DTYPES.index(t.dtype) for t in tensors]
    payload = torch.cat([t.reshape(-1).to("cpu", torch.int64) for t in tensors])
    return header(STEP, payload.numel(), *sizes, *codes), payload


def decode_step(head: torch.Tensor, payload: torch.Tensor, device: torch.device) -> StepMessage:
    """The step that ``encode_step`` packed, its tensors on ``device`` in their original dtypes."""
    num_tokens, num_reqs, width, num_logits, max_query_len, max_context_len = head[2:8].tolist()
    codes = head[8 : 8 + len(_FIELDS)].tolist()
    lengths = (
        num_tokens,
        num_tokens,
        num_tokens,
        num_reqs * width,
        num_reqs,
        num_reqs + 1,
        num_logits,
    )
    parts = [p.to(device, _DTYPES[code]) for p, code in zip(payload.split(lengths), codes)]
    fields = dict(zip(_FIELDS, parts))
    meta = AttentionMetadata(
        slot_mapping=fields["slot_mapping"],
        block_tables=fields["block_tables"].view(num_reqs, width),
        context_lens=fields["context_lens"],
        query_start_loc=fields["query_start_loc"],
        max_query_len=max_query_len,
        max_context_len=max_context_len,
    )
    return StepMessage(fields["input_ids"], fields["positions"], meta, fields["logits_indices"])
