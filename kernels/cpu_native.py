"""Typed ctypes bindings for the compiled CPU kernels (native/paged_attention.cpp, native/layer_ops.cpp).

Every wrapper takes torch tensors, checks nothing it does not need, and calls the float32 or
bfloat16 instance of the kernel. `available` says whether the kernels built on this machine.
"""

import ctypes
import functools

import torch

from spyglass.kernels import native_build

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    ("paged_attention", "paged_attention"): [_P] * 6 + [_I] * 8 + [_F, _I, _P],
    ("layer_ops", "add_rms_norm"): [_P, _I, _P, _I, _P, _F, _I, _I, _I, _P, _P],
    ("layer_ops", "rotary_embedding"): [_P] + [_I] * 5 + [_P, _P, _P, _I, _I],
    ("layer_ops", "silu_and_mul"): [_P, _I, _I, _I, _P],
    ("layer_ops", "store_kv"): [_P, _P, _I, _P, _I, _I, _I, _I, _P, _P],
}


@functools.cache
def _kernel(library_name: str, name: str, dtype: torch.dtype):
    library = native_build.load(library_name)
    if library is None or dtype not in _SUFFIX:
        return None
    function = getattr(library, f"spyglass_{name}_{_SUFFIX[dtype]}")
    function.argtypes = _SIGNATURES[(library_name, name)]
    function.restype = None
    return function


def build() -> bool:
    """Compile (or load from the cache) every native kernel now; whether they all loaded."""
    return all(native_build.load(library) is not None for library, _ in _SIGNATURES)


@functools.cache
def available(dtype: torch.dtype) -> bool:
    """Whether the native kernels run for ``dtype`` on this machine (builds them on first call)."""
    return all(_kernel(library, name, dtype) is not None for library, name in _SIGNATURES)


def paged_attention(query, k_cache, v_cache, block_tables, context_lens, query_start_loc, scale: float) -> torch.Tensor:
    """Causal attention of every request's new tokens over its paged context, ``[tokens, heads, dim]``.

    Shapes as `torch_attention.paged_attention`, caches head-major ``[kv_heads, blocks, block_size, dim]``;
    query rows may be strided but each row's heads must be contiguous.
    """
    if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
        query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    query_start_loc = query_start_loc.to(torch.int32).contiguous()
    num_kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    out = torch.empty(query.shape, dtype=query.dtype)
    _kernel("paged_attention", "paged_attention", query.dtype)(
        query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
        query_start_loc.data_ptr(), block_tables.shape[0], query.shape[1], num_kv_heads, head_dim, num_blocks,
        block_size, block_tables.stride(0), query.stride(0), scale, torch.get_num_threads(), out.data_ptr(),
    )
    return out


def add_rms_norm(x, residual, weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch_norm_rope.add_rms_norm`: ``(rms_norm(x + residual) * weight, x + residual)``; rows may be strided."""
    num_tokens, width = x.shape
    out = torch.empty(num_tokens, width, dtype=x.dtype)
    summed = torch.empty(num_tokens, width, dtype=x.dtype)
    _kernel("layer_ops", "add_rms_norm", x.dtype)(
        x.data_ptr(), x.stride(0), None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0), weight.data_ptr(), eps, num_tokens, width,
        torch.get_num_threads(), out.data_ptr(), summed.data_ptr(),
    )
    return out, summed


def rotary_embedding_(x, positions, cos, sin) -> None:
    """`torch_norm_rope.rotary_embedding_`: rotate ``x [tokens, heads, dim]`` (dim contiguous) in place."""
    positions = positions.to(torch.int64).contiguous()
    num_tokens, num_heads, head_dim = x.shape
    _kernel("layer_ops", "rotary_embedding", x.dtype)(
        x.data_ptr(), x.stride(0), x.stride(1), num_tokens, num_heads, head_dim, positions.data_ptr(),
        cos.data_ptr(), sin.data_ptr(), cos.stride(0), torch.get_num_threads(),
    )


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`torch_norm_rope.silu_and_mul`: ``silu(gate) * up`` for a contiguous ``[tokens, 2 * width]``."""
    num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
    gate_up = gate_up.contiguous()
    out = torch.empty(num_tokens, width, dtype=gate_up.dtype)
    _kernel("layer_ops", "silu_and_mul", gate_up.dtype)(
        gate_up.data_ptr(), num_tokens, width, torch.get_num_threads(), out.data_ptr()
    )
    return out


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """`cpu_attention.store_kv`: key and value ``[tokens, kv_heads, dim]`` share one row stride (views of qkv)."""
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    num_kv_heads, num_blocks, block_size, head_dim = k_cache.shape
    _kernel("layer_ops", "store_kv", key.dtype)(
        key.data_ptr(), value.data_ptr(), key.stride(0), slot_mapping.data_ptr(), key.shape[0], num_kv_heads,
        head_dim, num_blocks * block_size, k_cache.data_ptr(), v_cache.data_ptr(),
    )
