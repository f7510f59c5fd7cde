"""Automatic prefix caching: full KV blocks are named by a hash chained over the blocks before them.

Block ``i`` of a request is named ``hash((name of block i-1, tokens of block i))``, so equal
names mean equal tokens from the very start of the sequence (up to a 64-bit hash collision, as
in nano-vllm and vLLM's default). A request run with a LoRA adapter (its keys and values differ
from the base model's for the same tokens) or with a ``cache_salt`` starts its chain from its
`Request.cache_namespace`, so only requests of one namespace share blocks. A block that holds
image tokens (all the same placeholder id) is named by the digests of its images as well.

When a block fills (`spyglass_blocks_full`) its name goes into
the pool's hash map; when a new request arrives (`spyglass_match_prefix`) the longest run of its
leading blocks found there is reused. Finished requests' blocks stay cached in the pool's free
queue until `BlockPool.allocate` evicts them, least recently released first.

Records ``spyglass:prefix_cache_queries_total`` (prompt tokens looked up) and
``spyglass:prefix_cache_hits_total`` (prompt tokens found) once per request, when it is first
scheduled, labelled with the engine's model name and id. The entry point names
`PrefixCachePlugin`: each engine has its own instance, block names and counters.
"""

import weakref

from spyglass.core.plugin_api import (
    BlockPool,
    EngineConfig,
    EngineInfo,
    PluginContext,
    PrefixMatch,
    Request,
    hookimpl,
)
from spyglass.telemetry import metrics as m
from spyglass.telemetry import settings as telemetry_settings

ROOT_HASH = 0x5EED_5FC1  # the "parent" of every request's first block


def block_hashes(
    request: Request,
    num_blocks: int,
    block_size: int,
    names: "weakref.WeakKeyDictionary[Request, list[int]]",
) -> list[int]:
    """The chained names of the request's first ``num_blocks`` blocks (all must be full of known tokens).

    ``names`` keeps the names computed so far per live request (tokens of full blocks never change).
    """
    known = names.setdefault(request, [])
    if known:
        parent = known[-1]
    else:
        namespace = request.cache_namespace
        parent = ROOT_HASH if namespace is None else hash((ROOT_HASH, namespace))
    for index in range(len(known), num_blocks):
        start, end = index * block_size, (index + 1) * block_size
        tokens = tuple(request.token_ids_slice(start, end))
        # An image's tokens are all one placeholder: the image itself tells its blocks apart.
        parent = hash((parent, tokens, request.image_digests(start, end)))
        known.append(parent)
    return known[:num_blocks]


class PrefixCachePlugin:
    """One engine's prefix cache: the block names of its live requests and its hit counters."""

    def __init__(self, context: PluginContext):
        self.settings = telemetry_settings.resolve(context.telemetry)
        self.names: weakref.WeakKeyDictionary[Request, list[int]] = weakref.WeakKeyDictionary()
        self.series: m.EngineSeries | None = None

    @hookimpl
    def spyglass_match_prefix(
        self, request: Request, block_pool: BlockPool, block_size: int
    ) -> PrefixMatch | None:
        """The longest run of the request's leading blocks that the pool caches; never its last prompt token."""
        num_blocks = (request.num_tokens - 1) // block_size
        block_ids = []
        for name in block_hashes(request, num_blocks, block_size, self.names):
            block_id = block_pool.lookup(name)
            if block_id is None:
                break
            block_ids.append(block_id)
        if not block_ids:
            return None
        return PrefixMatch(tuple(block_ids), len(block_ids) * block_size)

    @hookimpl
    def spyglass_blocks_full(
        self,
        request: Request,
        block_ids: list[int],
        num_new: int,
        block_pool: BlockPool,
        block_size: int,
    ) -> None:
        """Name the newly filled blocks in the pool's hash map."""
        names = block_hashes(request, len(block_ids), block_size, self.names)
        for index in range(len(block_ids) - num_new, len(block_ids)):
            block_pool.cache_block(block_ids[index], names[index])

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Bind the counters to this engine's labels (when its metrics are on)."""
        if self.settings.metrics:
            self.series = m.EngineSeries(
                self.settings.served_model_name or info.model_name, info.engine_id
            )

    @hookimpl
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """Drop this engine's counters and block names."""
        if self.series is not None:
            self.series.remove()
            self.series = None
        self.names.clear()

    @hookimpl
    def spyglass_request_scheduled(self, request: Request, resumed: bool) -> None:
        """Count the lookup and the hit once per request (a resumed request was counted on admission)."""
        if resumed or self.series is None:
            return
        self.series.labels(m.PREFIX_CACHE_QUERIES).inc(request.num_prompt_tokens)
        self.series.labels(m.PREFIX_CACHE_HITS).inc(request.num_cached_tokens)
