"""How a Llama-style checkpoint splits over tensor-parallel ranks, and each rank's share of its weights.

The unit of attention sharding is a KV group: one KV head and the query heads that read it. Groups
are dealt out as evenly as they go (rank 0 gets the extra ones), so a model whose KV heads do not
divide by the rank count still splits: the default model's 3 KV heads over 2 ranks give rank 0 two
groups (6 query heads) and rank 1 one group (3 query heads). KV heads are never replicated, so the
rank count may not exceed the KV head count. The MLP's intermediate dimension and the vocabulary
split evenly (the intermediate one on 32-wide quantization blocks where it can).

Column-parallel projections (q/k/v, gate/up, the embedding and LM head rows) keep whole rows; the
row-parallel ones (o, down) keep a range of columns, and their partial outputs are summed across
ranks. GGUF blocks (`QuantizedWeight`) split by rows freely and by columns on 32-wide block edges;
a column cut inside a block dequantizes that one matrix (logged).
"""

import dataclasses
import itertools
import logging
from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES

from spyglass.core.models import llama
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import QuantizedWeight, cat_rows
from spyglass.core.models.registry import family

log = logging.getLogger("spyglass.engine")

_BLOCK = 32  # values per GGUF quantization block (Q4_0, Q4_1, Q8_0)


@dataclass(frozen=True, slots=True)
class RankShard:
    """What one rank holds: ranges of KV heads, query heads, intermediate columns and vocabulary rows.

    ``vocab_chunk`` is the padded width every rank contributes when the logits are gathered
    (gathers need equal sizes; the last rank's padding is cut off again).
    """

    rank: int
    world_size: int
    kv_heads: range
    q_heads: range
    intermediate: range
    vocab: range
    vocab_chunk: int


def check_tensor_parallel(arch: ModelArchConfig, world_size: int) -> None:
    """Raise ``ValueError`` saying why ``arch`` cannot run on ``world_size`` ranks, if it cannot."""
    name = arch.architecture
    if world_size < 1:
        raise ValueError(f"tensor_parallel_size must be at least 1, got {world_size}")
    if family(name).model_class is not llama.LlamaForCausalLM or arch.moe_layers:
        raise ValueError(
            f"tensor parallelism supports the dense Llama-style families (llama, qwen2, qwen3, mistral, phi3), "
            f"not {name!r}"
        )
    if world_size > arch.num_key_value_heads:
        raise ValueError(
            f"tensor_parallel_size {world_size} exceeds the model's {arch.num_key_value_heads} KV heads: each rank "
            f"holds whole KV heads (they are not replicated), so use at most {arch.num_key_value_heads}"
        )


def _split(total: int, world_size: int, unit: int = 1) -> list[range]:
    """``range(total)`` cut into ``world_size`` near-equal parts on multiples of ``unit`` where possible."""
    if total // unit < world_size:
        unit = 1
    units = total // unit
    edges = [units * r // world_size * unit for r in range(world_size)] + [total]
    return [range(a, b) for a, b in itertools.pairwise(edges)]


def plan_shard(arch: ModelArchConfig, rank: int, world_size: int) -> RankShard:
    """Rank ``rank``'s share of ``arch`` on ``world_size`` ranks (see the module docstring)."""
    check_tensor_parallel(arch, world_size)
    num_groups = arch.num_key_value_heads
    sizes = [num_groups // world_size + (r < num_groups % world_size) for r in range(world_size)]
    start = sum(sizes[:rank])
    kv_heads = range(start, start + sizes[rank])
    per_group = arch.num_attention_heads // num_groups
    chunk = -(-arch.vocab_size // world_size)
    return RankShard(
        rank=rank,
        world_size=world_size,
        kv_heads=kv_heads,
        q_heads=range(kv_heads.start * per_group, kv_heads.stop * per_group),
        intermediate=_split(arch.intermediate_size, world_size, _BLOCK)[rank],
        vocab=range(min(rank * chunk, arch.vocab_size), min((rank + 1) * chunk, arch.vocab_size)),
        vocab_chunk=chunk,
    )


def rank_arch(arch: ModelArchConfig, shard: RankShard) -> ModelArchConfig:
    """``arch`` as one rank's model sees it: its own heads and MLP width (the vocabulary stays whole)."""
    return dataclasses.replace(
        arch,
        num_attention_heads=len(shard.q_heads),
        num_key_value_heads=len(shard.kv_heads),
        intermediate_size=len(shard.intermediate),
    )


def _rows(weight, span: range):
    """Rows ``span`` of a matrix (or elements of a vector), copied so that the shard owns its memory."""
    if isinstance(weight, QuantizedWeight):
        return QuantizedWeight(weight.data[span.start : span.stop].clone(), weight.qtype)
    return weight[span.start : span.stop].clone()


def _columns(weight, span: range, dtype: torch.dtype):
    """Columns ``span`` of a matrix, copied; GGUF blocks are cut on block edges or dequantized."""
    if not isinstance(weight, QuantizedWeight):
        return weight[:, span.start : span.stop].clone(memory_format=torch.contiguous_format)
    if span.start % _BLOCK or span.stop % _BLOCK:
        log.info(
            "tensor parallelism: a column cut at %d..%d splits GGUF blocks; that matrix is dequantized",
            span.start,
            span.stop,
        )
        return weight.dequantize()[:, span.start : span.stop].to(dtype).contiguous()
    block_size, block_bytes = GGML_QUANT_SIZES[weight.qtype]
    data = weight.data[
        :, span.start // block_size * block_bytes : span.stop // block_size * block_bytes
    ]
    return QuantizedWeight(data.clone(memory_format=torch.contiguous_format), weight.qtype)


def _scaled(span: range, factor: int, offset: int = 0) -> range:
    return range(offset + span.start * factor, offset + span.stop * factor)


def _parts(weights: dict, fused: str, names: list[str], sizes: list[int]) -> list:
    """The parts ``names`` of a projection, cut out of the fused matrix where the checkpoint stores it fused."""
    if fused not in weights:
        return [weights[name] for name in names]
    offsets = itertools.accumulate(sizes, initial=0)
    return [_rows(weights[fused], range(a, a + n)) for a, n in zip(offsets, sizes)]


def shard_weights(weights: dict, arch: ModelArchConfig, shard: RankShard) -> dict:
    """The weights rank ``shard.rank`` holds, under the HF names `llama.LlamaForCausalLM` reads.

    q/k/v and gate/up come out fused (``qkv_proj``, ``gate_up_proj``), which the layers accept
    for every family; norms are replicated.
    """
    dtype = weights["model.norm.weight"].dtype
    hd = arch.head_dim
    q_size, kv_size = arch.num_attention_heads * hd, arch.num_key_value_heads * hd
    q_rows, kv_rows = _scaled(shard.q_heads, hd), _scaled(shard.kv_heads, hd)
    out = {"model.norm.weight": weights["model.norm.weight"].clone()}
    out["model.embed_tokens.weight"] = _rows(weights["model.embed_tokens.weight"], shard.vocab)
    if not arch.tie_word_embeddings:
        out["lm_head.weight"] = _rows(weights["lm_head.weight"], shard.vocab)
    for layer in range(arch.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        attn, mlp = f"{prefix}.self_attn", f"{prefix}.mlp"
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[f"{prefix}.{name}.weight"] = weights[f"{prefix}.{name}.weight"].clone()
        for kind in ("weight", "bias") if arch.attention_bias else ("weight",):
            q, k, v = _parts(
                weights,
                f"{attn}.qkv_proj.{kind}",
                [f"{attn}.{p}_proj.{kind}" for p in "qkv"],
                [q_size, kv_size, kv_size],
            )
            out[f"{attn}.qkv_proj.{kind}"] = cat_rows(
                [_rows(q, q_rows), _rows(k, kv_rows), _rows(v, kv_rows)]
            )
        out[f"{attn}.o_proj.weight"] = _columns(weights[f"{attn}.o_proj.weight"], q_rows, dtype)
        if arch.qk_norm:
            for name in ("q_norm", "k_norm"):
                out[f"{attn}.{name}.weight"] = weights[f"{attn}.{name}.weight"].clone()
        gate, up = _parts(
            weights,
            f"{mlp}.gate_up_proj.weight",
            [f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"],
            [arch.intermediate_size] * 2,
        )
        out[f"{mlp}.gate_up_proj.weight"] = cat_rows(
            [_rows(gate, shard.intermediate), _rows(up, shard.intermediate)]
        )
        out[f"{mlp}.down_proj.weight"] = _columns(
            weights[f"{mlp}.down_proj.weight"], shard.intermediate, dtype
        )
    return out
