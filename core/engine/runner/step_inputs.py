"""A step's model inputs from the scheduler's plan: token ids, positions, KV slots, block tables,
and the rows whose logits are sampled."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from spyglass.core.engine.mrope_positions import step_rope_positions
from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.block_table_rows import BlockTableRows
from spyglass.core.engine.runner.uploads import upload
from spyglass.core.engine.sched.scheduler import SchedulerOutput
from spyglass.core.models.attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from spyglass.core.engine.runner.model_runner import LaunchedStep


@dataclass(frozen=True, slots=True)
class StepInputs:
    """The flattened batch for one forward. ``positions`` are the tokens' rope positions:
    ``[tokens]``, or M-RoPE's ``[3, tokens]`` in a step that computes a Qwen2-VL image."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_indices: torch.Tensor
    sampled_rows: tuple[bool, ...]
    prompt_rows: tuple[int, ...] = ()
    """Per request, how many prompt-logprob rows follow the sampled rows in ``logits_indices``
    (`_prompt_logprob_rows`); empty when the step scores no prompt token."""
    prompt_targets: tuple[int, ...] = ()
    """The prompt tokens those rows score, in turn."""


def build_step_inputs(
    out: SchedulerOutput,
    block_tables: dict[str, list[int]],
    table_rows: BlockTableRows,
    block_size: int,
    device: torch.device,
    after: "LaunchedStep | None" = None,
) -> StepInputs:
    """Build input ids, positions, slot mapping and block tables for the scheduled requests (the
    tables through ``table_rows``, the runner's copy of them kept across steps).

    Per request only its numbers are read; every per-token array is built by whole-array numpy
    operations, so the host's share of a step grows slowly with the batch. A request's pending
    token (sampled by ``after``, a step still in flight) is read from that step's ids on the
    device, so the host need not wait for them.
    """
    bs, scheduled, num_reqs = block_size, out.scheduled, len(out.scheduled)
    requests = [s.request for s in scheduled]
    num_new = np.fromiter((s.num_new_tokens for s in scheduled), np.int64, num_reqs)
    starts = np.fromiter((r.num_launched_tokens for r in requests), np.int64, num_reqs)
    ends = starts + num_new
    max_query_len = int(num_new.max())
    # A request is sampled once the step reaches its end (drafts included): its last rows are.
    sampled = ends >= np.fromiter((r.num_tokens_with_spec for r in requests), np.int64, num_reqs)
    if max_query_len == 1:
        # A decode step (one token each, so no drafts): request i's token is row i, and there is
        # nothing to concatenate (a few numpy calls fewer, most of the host's cost at small batches).
        query_start = np.arange(num_reqs + 1, dtype=np.int32)
        positions, owner = starts, np.arange(num_reqs)
        logits_rows = np.flatnonzero(sampled)
    else:
        query_start = np.zeros(num_reqs + 1, dtype=np.int32)
        query_start[1:] = num_new.cumsum()
        positions = _concatenated_ranges(starts, num_new)
        owner = np.repeat(np.arange(num_reqs), num_new)
        num_spec = np.fromiter((s.num_spec_tokens for s in scheduled), np.int64, num_reqs)
        num_rows = np.where(sampled, num_spec + 1, 0)
        logits_rows = _concatenated_ranges(query_start[1:] - num_rows, num_rows)
    req_ids = [r.req_id for r in requests]
    ends_list = ends.tolist()
    tokens = _known_token_ids(requests, starts.tolist(), ends_list)
    pending_at, pending_rows = _pending_rows(
        requests, req_ids, ends_list, query_start[1:].tolist(), after
    )
    table_array = table_rows.gather(req_ids, block_tables)
    slots = table_array[owner, positions // bs].astype(np.int64) * bs + positions % bs
    context_lens = ends.astype(np.int32)
    prompt_rows: tuple[int, ...] = ()
    prompt_targets: tuple[int, ...] = ()
    if any(r.prompt_logprobs is not None for r in requests):
        extra, counts, targets = _prompt_logprob_rows(requests, starts, ends, query_start)
        if extra.size:  # a decode step of requests that asked for prompt logprobs scores none
            logits_rows = np.concatenate([logits_rows, extra])
            prompt_rows, prompt_targets = counts, targets
    rope_positions = step_rope_positions(
        [r.rope_positions for r in requests], starts, ends, query_start, positions
    )
    uploaded = upload(
        [np.array(tokens), rope_positions, slots, logits_rows]
        + [np.array(pending_at, np.int64), np.array(pending_rows, np.int64)]
        + [table_array, context_lens, query_start],
        (np.int64,) * 6 + (np.int32,) * 3,
        device,
    )
    input_ids, positions_t, slot_mapping, logits_indices, at, rows = uploaded[:6]
    tables_t, context_lens_t, query_start_t = uploaded[6:]
    if len(pending_at) == num_reqs == len(input_ids) and pending_at == pending_rows:
        # The same decode batch as ``after``'s, in its order: one copy, no gather and scatter.
        input_ids.copy_(after.device_token_ids[:num_reqs])
    elif len(pending_at):
        input_ids[at] = after.device_token_ids[rows]
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        block_tables=tables_t,
        context_lens=context_lens_t,
        query_start_loc=query_start_t,
        max_query_len=max_query_len,
        max_context_len=int(context_lens.max()),
    )
    return StepInputs(
        input_ids,
        positions_t,
        meta,
        logits_indices,
        tuple(sampled.tolist()),
        prompt_rows,
        prompt_targets,
    )


def _prompt_logprob_rows(
    requests: list[Request], starts: np.ndarray, ends: np.ndarray, query_start: np.ndarray
) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]:
    """The batch rows whose logits give the logprobs of prompt tokens not yet scored, request by
    request, how many each request has, and the prompt tokens they score, in turn. Position ``p``'s
    logits score prompt token ``p + 1``; a request recomputed after a preemption skips the positions
    it has scored."""
    rows, counts, targets = [], [], []
    for index, request in enumerate(requests):
        count = 0
        if request.prompt_logprobs is not None:
            start = int(starts[index])
            first = max(start, len(request.prompt_logprobs) - 1)
            last = min(int(ends[index]), request.num_prompt_tokens - 1)
            count = max(0, last - first)
            rows.append(np.arange(count) + int(query_start[index]) + first - start)
            targets += request.prompt_token_ids[first + 1 : first + 1 + count]
        counts.append(count)
    return np.concatenate(rows).astype(np.int64), tuple(counts), tuple(targets)


def _known_token_ids(requests: list[Request], starts: list[int], ends: list[int]) -> list[int]:
    """Each request's token ids ``[start, end)`` one after another, a pending token's as 0 (its
    placeholder, filled on the device)."""
    tokens: list[int] = []
    for request, start, end in zip(requests, starts, ends):
        if start >= request.num_tokens and not request.spec_token_ids:
            tokens += [0] * (end - start)  # all pending (async scheduling's decode): none known
            continue
        part = request.token_ids_slice(start, end)
        tokens += part
        if len(part) < end - start:
            tokens += [0] * (end - start - len(part))
    return tokens


def _pending_rows(
    requests: list[Request],
    req_ids: list[str],
    ends: list[int],
    query_ends: list[int],
    after: "LaunchedStep | None",
) -> tuple[list[int], list[int]]:
    """Where the step's pending tokens go in its input ids, and their rows in ``after``'s sampled ids.

    A request's pending token (one at most: only ``after`` is in flight) is its last new token.
    """
    at: list[int] = []
    rows: list[int] = []
    if after is None:  # only a step launched while another is in flight has pending tokens
        return at, rows
    same_order = after.sampled_req_ids == tuple(req_ids)  # a decode batch that went on as it was
    row_of = None if same_order else {r: row for row, r in enumerate(after.sampled_req_ids)}
    for index, (request, end, query_end) in enumerate(zip(requests, ends, query_ends)):
        if request.num_pending_tokens and end > request.num_tokens:
            at.append(query_end - 1)
            rows.append(index if row_of is None else row_of[request.req_id])
    return at, rows


def _concatenated_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``range(starts[i], starts[i] + lengths[i])`` for every ``i``, one after another."""
    offsets = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) + np.repeat(starts - offsets, lengths)
