"""Paged attention on the GPU for `gpu_check`: accuracy against torch, and time and bandwidth per
decode shape, with the default tiling and with each tiling of a sweep (issue 19, item 2)."""

import functools
import statistics
from collections.abc import Callable, Iterator

import torch

from spyglass.kernels import torch_attention, triton_attention


def timed(function, repeats: int = 20) -> float:
    """Median seconds of ``function()`` on the GPU, after a warm-up."""
    function()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def timed_in_graph(function, calls: int = 20) -> float:
    """Median seconds of one ``function()`` replayed from a CUDA graph of ``calls`` calls: the GPU's
    time without the host's launch overhead, as a decode step inside a captured graph sees it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        function()  # compiles, and allocates outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            function()
    return timed(graph.replay, repeats=5) / calls


def copy_bandwidth() -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write), on 1 GiB."""
    source = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    return 2 * source.numel() / timed(lambda: target.copy_(source))


# Decode attention as the 1B shape and Llama-3-8B run it: 32 query and 8 KV heads of 128, bf16, pages of 16.
HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 128, 16
# Caches above this many bytes are left out (the GPU holds the tensors of one case at a time).
MAX_CACHE_BYTES = 40e9


def bandwidth_rows(measured: dict[str, float]) -> list[str]:
    """`copy_bandwidth` into ``measured["bandwidth"]``, and a row saying it."""
    measured["bandwidth"] = copy_bandwidth()
    return [f"device-to-device copy: {measured['bandwidth'] / 1e9:.0f} GB/s (read + write)"]


def decode_cases(contexts: tuple[int, ...]) -> Iterator[tuple[int, int]]:
    """(context, batch) for every batch from 1 to 256 at each context whose cache fits."""
    for context in contexts:
        for batch in (1, 8, 64, 256):
            if batch * context * KV_HEADS * DIM * 2 * 2 <= MAX_CACHE_BYTES:
                yield context, batch


def decode_inputs(context: int, batch: int, device: str = "cuda") -> tuple:
    """`paged_attention`'s arguments for ``batch`` decodes over ``context`` cached positions each,
    their pages scattered through the cache."""
    blocks_per_seq = context // BLOCK
    num_blocks = batch * blocks_per_seq
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, dtype=torch.bfloat16, device=device)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=device, dtype=torch.int32).view(
        batch, blocks_per_seq
    )
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device)
    query = torch.randn(batch, HEADS, DIM, dtype=torch.bfloat16, device=device)
    return query, k_cache, v_cache, tables, lens, starts, 1, context, DIM**-0.5


def cache_bytes(inputs: tuple) -> int:
    """Bytes of keys and values a decode step over ``inputs`` reads."""
    k_cache = inputs[1]
    return 2 * k_cache.numel() * k_cache.element_size()


def attention_table(bandwidth: float, quick: bool) -> list[str]:
    """Decode paged attention (`HEADS`, `KV_HEADS` ...): time called eagerly and replayed in a CUDA
    graph (as decode runs while serving), and the graph's bandwidth fraction."""
    rows = [
        "| context | batch | eager ms | in graph ms | GB/s | of copy bw |",
        "|---|---|---|---|---|---|",
    ]
    for context, batch in decode_cases((512, 8192) if quick else (512, 2048, 8192, 32768)):
        inputs = decode_inputs(context, batch)
        attend = functools.partial(triton_attention.paged_attention, *inputs)
        eager, in_graph = timed(attend), timed_in_graph(attend)
        moved = cache_bytes(inputs)
        rows.append(
            f"| {context} | {batch} | {eager * 1e3:.3f} | {in_graph * 1e3:.3f} | "
            f"{moved / in_graph / 1e9:.0f} | {moved / in_graph / bandwidth:.0%} |"
        )
    return rows


def mixed_inputs(chunk: int, decodes: int, context: int, device: str = "cuda") -> tuple:
    """`paged_attention`'s arguments for a step of one prompt chunk of ``chunk`` new tokens (the
    last of ``context``) among ``decodes`` decodes over ``context`` positions each."""
    batch = decodes + 1
    query, k_cache, v_cache, tables, lens, _, _, _, scale = decode_inputs(context, batch, device)
    q_lens = torch.tensor([chunk] + [1] * decodes, dtype=torch.int32, device=device)
    starts = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    starts[1:] = q_lens.cumsum(0)
    query = torch.randn(chunk + decodes, HEADS, DIM, dtype=torch.bfloat16, device=device)
    return query, k_cache, v_cache, tables, lens, starts, chunk, context, scale


def mixed_step_table() -> list[str]:
    """A prompt chunk among decodes (`HEADS`, `KV_HEADS` ...; context 2048 each): the unified
    kernel's time with every request given the chunk's query tiles, and with the tiles packed
    (`query_tile_grid`), eager and in a CUDA graph."""
    rows = [
        "| chunk | decodes | padded eager ms | packed eager ms | padded in graph ms | "
        "packed in graph ms |",
        "|---|---|---|---|---|---|",
    ]
    padded = triton_attention.Tiling(pack_query_tiles=False)
    for chunk, decodes in ((512, 63), (2000, 63), (512, 255), (2000, 255)):
        inputs = mixed_inputs(chunk, decodes, 2048)
        cells = []
        for tiling in (padded, triton_attention.DEFAULT_TILING):
            attend = functools.partial(triton_attention.unified_attention, *inputs, tiling=tiling)
            cells.append((timed(attend), timed_in_graph(attend)))
        eager, in_graph = zip(*cells)
        rows.append(
            f"| {chunk} | {decodes} | "
            + " | ".join(f"{seconds * 1e3:.3f}" for seconds in eager + in_graph)
            + " |"
        )
    return rows


# What the sweep tries: tiles of 32, 64 (the default at head_dim 128 in bf16) and 128 positions,
# 4 or 8 warps, 2 or 3 pipeline stages (3 and 4 warps are Triton's defaults).
SWEEP = tuple(
    triton_attention.Tiling(kv_tile, num_warps, num_stages)
    for kv_tile in (32, 64, 128)
    for num_warps in (4, 8)
    for num_stages in (2, 3)
)


def tiled(
    inputs: tuple, tiling: "triton_attention.Tiling | None", num_sms: int
) -> Callable[[], torch.Tensor]:
    """``inputs``' decode attention with ``tiling`` (None: the kernel's default), through the kernel
    `paged_attention` would pick on a GPU of ``num_sms`` multiprocessors."""
    query, k_cache, v_cache, tables, lens, _starts, _rows, context, scale = inputs
    batch = tables.shape[0]
    splits = triton_attention.num_kv_splits(batch, KV_HEADS, batch, 1, context, num_sms)
    chosen = {} if tiling is None else {"tiling": tiling}
    if splits > 1:
        return lambda: triton_attention.split_k_decode_attention(
            query, k_cache, v_cache, tables, lens, scale, splits, **chosen
        )
    return lambda: triton_attention.unified_attention(*inputs, **chosen)


def tiling_sweep_table(bandwidth: float, quick: bool) -> list[str]:
    """Decode attention at contexts of 2k and more (issue 19's 70% target) with every tiling of
    `SWEEP`: each one's fraction of copy bandwidth (in a CUDA graph), and the best per case. A
    tiling the GPU cannot launch (its tiles need more shared memory than a program may have) shows
    as "-"."""
    names = [f"{t.kv_tile}/{t.num_warps}w/{t.num_stages}s" for t in SWEEP]
    rows = [
        "| context | batch | default | best | best tiling | " + " | ".join(names) + " |",
        "|---|---|---|---|---|" + "---|" * len(names),
    ]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for context, batch in decode_cases((2048, 8192) if quick else (2048, 8192, 32768)):
        inputs = decode_inputs(context, batch)

        def fraction(tiling: triton_attention.Tiling | None) -> float | None:
            try:
                seconds = timed_in_graph(tiled(inputs, tiling, sms))
            except Exception as error:  # e.g. triton's OutOfResources for the largest tiles
                print(f"tiling {tiling} at context {context}, batch {batch}: {error}")
                return None
            return cache_bytes(inputs) / seconds / bandwidth

        default = fraction(None)
        fractions = [fraction(tiling) for tiling in SWEEP]
        best = max(range(len(SWEEP)), key=lambda i: fractions[i] or 0.0)
        cells = [_percent(f) for f in (default, fractions[best])] + [names[best]]
        rows.append(
            f"| {context} | {batch} | "
            + " | ".join(cells + [_percent(f) for f in fractions])
            + " |"
        )
    return rows


def split_count_table(bandwidth: float) -> list[str]:
    """Split-K decode (few requests, long contexts: issue 19's hardest cases) at half, once, twice
    and four times the partitions `num_kv_splits` chooses, each as a fraction of copy bandwidth
    (in a CUDA graph, the kernel's default tiling)."""
    rows = [
        "| context | batch | chosen splits | x1/2 | x1 | x2 | x4 |",
        "|---|---|---|---|---|---|---|",
    ]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for context in (2048, 8192, 32768):
        for batch in (1, 8):
            query, k_cache, v_cache, tables, lens, *_, scale = decode_inputs(context, batch)
            chosen = triton_attention.num_kv_splits(batch, KV_HEADS, batch, 1, context, sms)
            cells = []
            for splits in (max(2, chosen // 2), chosen, 2 * chosen, 4 * chosen):
                splits = min(splits, triton_attention.MAX_SPLITS)
                seconds = timed_in_graph(
                    lambda splits=splits: triton_attention.split_k_decode_attention(
                        query, k_cache, v_cache, tables, lens, scale, splits
                    )
                )
                moved = 2 * k_cache.numel() * k_cache.element_size()
                cells.append(f"{splits}: {moved / seconds / bandwidth:.0%}")
            rows.append(f"| {context} | {batch} | {chosen} | " + " | ".join(cells) + " |")
    return rows


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.0%}"


def kernel_error_against_torch() -> float:
    """Decode and mixed batches on the GPU: Triton vs the torch reference, the max abs error."""
    torch.manual_seed(0)
    k_cache = torch.randn(512, 16, 3, 64, device="cuda")
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(512, device="cuda", dtype=torch.int32).view(8, 64)
    lens = torch.tensor([1000, 17, 300, 1024, 5, 64, 700, 129], dtype=torch.int32, device="cuda")
    q_lens = [1, 17, 4, 1, 5, 1, 30, 2]
    starts = torch.tensor(
        [0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda"
    )
    query = torch.randn(sum(q_lens), 9, 64, device="cuda")
    args = (query, k_cache, v_cache, tables, lens, starts, max(q_lens), 1024, 0.125)
    difference = triton_attention.paged_attention(*args) - torch_attention.paged_attention(*args)
    return difference.abs().max().item()
