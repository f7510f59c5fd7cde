"""Automatic prefix caching: full KV blocks are named by a hash chained over the blocks before them.

Block ``i`` of a request is named ``hash((name of block i-1, tokens of block i))``, so equal
names mean equal tokens from the very start of the sequence (up to a 64-bit hash collision, as
in nano-vllm and vLLM's default). When a block fills (`spyglass_blocks_full`) its name goes into
the pool's hash map; when a new request arrives (`spyglass_match_prefix`) the longest run of its
leading blocks found there is reused. Finished requests' blocks stay cached in the pool's free
queue until `BlockPool.allocate` evicts them, least recently released first.

Records ``spyglass:prefix_cache_queries_total`` (prompt tokens looked up) and
``spyglass:prefix_cache_hits_total`` (prompt tokens found) once per request, when it is first
scheduled.
"""

import weakref

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.kv.kv_cache_manager import PrefixMatch
from spyglass.core.engine.request import Request
from spyglass.telemetry import metrics as m
from spyglass.telemetry import settings as telemetry_settings

ROOT_HASH = 0x5EED_5FC1  # the "parent" of every request's first block

# The block names computed so far per live request (tokens of full blocks never change).
_names: "weakref.WeakKeyDictionary[Request, list[int]]" = weakref.WeakKeyDictionary()
_model_name: str | None = None


def block_hashes(request: Request, num_blocks: int, block_size: int) -> list[int]:
    """The chained names of the request's first ``num_blocks`` blocks (all must be full of known tokens)."""
    names = _names.setdefault(request, [])
    parent = names[-1] if names else ROOT_HASH
    for index in range(len(names), num_blocks):
        tokens = tuple(request.token_ids_slice(index * block_size, (index + 1) * block_size))
        parent = hash((parent, tokens))
        names.append(parent)
    return names[:num_blocks]


@hookimpl
def spyglass_match_prefix(request, block_pool, block_size):
    """The longest run of the request's leading blocks that the pool caches; never its last prompt token."""
    num_blocks = (request.num_tokens - 1) // block_size
    block_ids = []
    for name in block_hashes(request, num_blocks, block_size):
        block_id = block_pool.lookup(name)
        if block_id is None:
            break
        block_ids.append(block_id)
    if not block_ids:
        return None
    return PrefixMatch(tuple(block_ids), len(block_ids) * block_size)


@hookimpl
def spyglass_blocks_full(request, block_ids, num_new, block_pool, block_size):
    """Name the newly filled blocks in the pool's hash map."""
    names = block_hashes(request, len(block_ids), block_size)
    for index in range(len(block_ids) - num_new, len(block_ids)):
        block_pool.cache_block(block_ids[index], names[index])


@hookimpl
def spyglass_engine_started(info):
    """Remember the model name for the counters' label."""
    global _model_name
    _model_name = info.model_name


@hookimpl
def spyglass_request_scheduled(request, resumed):
    """Count the lookup and the hit once per request (a resumed request was counted on admission)."""
    if resumed or _model_name is None or not telemetry_settings.current().metrics:
        return
    m.PREFIX_CACHE_QUERIES.labels(_model_name).inc(request.num_prompt_tokens)
    m.PREFIX_CACHE_HITS.labels(_model_name).inc(request.num_cached_tokens)
