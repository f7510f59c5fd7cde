"""The runner's inputs: token slices across prompt, output and drafts, and a step's model inputs
(`build_step_inputs`) against a request-by-request reference, for decode steps (their shortcut),
verify steps, prompt chunks and pending tokens read from a step in flight."""

import random

import numpy as np
import torch

from spyglass.core.engine.request import Request
from spyglass.core.engine.runner.block_table_rows import BlockTableRows
from spyglass.core.engine.runner.model_runner import LaunchedStep
from spyglass.core.engine.runner.step_inputs import build_step_inputs
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.sched.scheduler import ScheduledRequest, SchedulerOutput

BLOCK_SIZE = 4
PENDING_ID = 10_000  # the in-flight step's ids are these plus the row


def _request(rng: random.Random, index: int, kind: str, pending: bool) -> tuple[Request, int, int]:
    """A request in the middle of its life, and how many new tokens (drafts among them) it gets."""
    prompt = [rng.randrange(1, 500) for _ in range(rng.randrange(2, 30))]
    request = Request(f"r{index}", prompt, SamplingParams(), max_tokens=1000)
    request.output_token_ids = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 9))]
    if kind == "prompt chunk":
        request.output_token_ids = []
        request.num_computed_tokens = rng.randrange(0, len(prompt) - 1)
        return request, rng.randrange(1, len(prompt) - request.num_computed_tokens + 1), 0
    request.num_pending_tokens = int(pending)
    # Every real token but the last is computed: a pending one is the last, so the one before
    # it was computed by the step in flight.
    request.num_computed_tokens = request.num_tokens + request.num_pending_tokens - 1
    if kind == "verify":
        request.spec_token_ids = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 4))]
        drafts = len(request.spec_token_ids)
        return request, 1 + drafts, drafts
    return request, 1, 0


def _reference(scheduled, tables, pending_ids):
    """Each array of the step, built one request and one token at a time."""
    ids, positions, slots, logits_rows, context_lens, query_start = [], [], [], [], [], [0]
    for s in scheduled:
        request = s.request
        known = request.all_token_ids + pending_ids.get(request.req_id, []) + request.spec_token_ids
        start = request.num_computed_tokens
        end = start + s.num_new_tokens
        for position in range(start, end):
            ids.append(known[position])
            positions.append(position)
            block = tables[request.req_id][position // BLOCK_SIZE]
            slots.append(block * BLOCK_SIZE + position % BLOCK_SIZE)
        query_start.append(query_start[-1] + s.num_new_tokens)
        context_lens.append(end)
        if end >= request.num_tokens_with_spec:
            logits_rows += range(query_start[-1] - s.num_spec_tokens - 1, query_start[-1])
    return ids, positions, slots, logits_rows, context_lens, query_start


def _check_step(rng: random.Random, kinds: list[str], pending: str) -> None:
    requests = []
    for index, kind in enumerate(kinds):
        # Drafts are proposed for a known last token (no async scheduling with speculation).
        requests.append(_request(rng, index, kind, pending != "none" and kind == "decode"))
    scheduled = tuple(ScheduledRequest(r, n, d) for r, n, d in requests)
    tables = {}
    free = list(range(1000))
    rng.shuffle(free)
    for s in scheduled:
        needed = -(-(s.request.num_computed_tokens + s.num_new_tokens) // BLOCK_SIZE)
        tables[s.request.req_id] = [free.pop() for _ in range(needed)]
    after, pending_ids = None, {}
    with_pending = [s.request for s in scheduled if s.request.num_pending_tokens]
    if with_pending:
        # The step in flight sampled them in the same order, or others too, in another order.
        order = list(with_pending)
        if pending == "shuffled":
            order += [Request(f"gone{i}", [1, 2], SamplingParams()) for i in range(3)]
            rng.shuffle(order)
        req_ids = tuple(r.req_id for r in order)
        device_ids = torch.tensor([PENDING_ID + row for row in range(len(order))])
        after = LaunchedStep(0.0, (True,) * len(order), device_ids, device_ids, req_ids)
        pending_ids = {r.req_id: [PENDING_ID + req_ids.index(r.req_id)] for r in with_pending}
    out = SchedulerOutput(1, scheduled, (), (), ())
    got = build_step_inputs(out, tables, BlockTableRows(), BLOCK_SIZE, torch.device("cpu"), after)
    ids, positions, slots, logits_rows, context_lens, query_start = _reference(
        scheduled, tables, pending_ids
    )
    assert got.input_ids.tolist() == ids
    assert got.positions.tolist() == positions
    assert got.meta.slot_mapping.tolist() == slots
    assert got.logits_indices.tolist() == logits_rows
    assert got.meta.context_lens.tolist() == context_lens
    assert got.meta.query_start_loc.tolist() == query_start
    assert got.meta.max_query_len == max(s.num_new_tokens for s in scheduled)
    assert got.meta.max_context_len == max(context_lens)
    width = max(len(t) for t in tables.values())
    expected_tables = [tables[s.request.req_id] for s in scheduled]
    padded = [table + [0] * (width - len(table)) for table in expected_tables]
    assert np.array_equal(got.meta.block_tables.numpy(), np.array(padded, dtype=np.int32))


def test_decode_steps_match_the_reference_with_and_without_tokens_in_flight():
    rng = random.Random(0)
    for _ in range(30):
        kinds = ["decode"] * rng.randrange(1, 12)
        for pending in ("none", "same order", "shuffled"):
            _check_step(rng, kinds, pending)


def test_mixed_steps_of_prompt_chunks_decodes_and_drafts_match_the_reference():
    rng = random.Random(1)
    for _ in range(60):
        kinds = [
            rng.choice(["decode", "verify", "prompt chunk"]) for _ in range(rng.randrange(1, 9))
        ]
        for pending in ("none", "same order", "shuffled"):
            _check_step(rng, kinds, pending)


def test_token_ids_slice_matches_the_whole_sequence_sliced():
    request = Request("r", [1, 2, 3, 4], SamplingParams(max_tokens=8))
    request.output_token_ids += [5, 6, 7]
    request.spec_token_ids = [8, 9]
    whole = request.all_token_ids + request.spec_token_ids
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert request.token_ids_slice(start, end) == whole[start:end], (start, end)
