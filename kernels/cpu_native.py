"""Typed ctypes bindings for the compiled CPU kernels (native/paged_attention.cpp, layer_ops.cpp, moe.cpp).

`NativeKernels` is one instruction-set variant's build (see `cpu_isa`); the module-level functions
call the variant this CPU runs best (`SPYGLASS_KERNEL_VARIANT` names another runnable one). Every
wrapper takes torch tensors, checks nothing it does not need, and calls the float32 or bfloat16
instance of the kernel; attention and the KV store also have a float32 instance over a float16 cache
(``--kv-cache-dtype float16``). `available` says whether the kernels built on this machine.
"""

import ctypes
import functools
import os

import torch

from spyglass.kernels import cpu_isa, native_build

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {
    ("paged_attention", "paged_attention"): [_P] * 6 + [_I] * 8 + [_F, _I, _F, _I, _P],
    ("layer_ops", "add_rms_norm"): [_P, _I, _P, _I, _P, _F, _I, _I, _I, _P, _P],
    ("layer_ops", "rotary_embedding"): [_P] + [_I] * 5 + [_P, _P, _P, _I, _I],
    ("layer_ops", "silu_and_mul"): [_P, _I, _I, _I, _P],
    ("layer_ops", "store_kv"): [_P, _P, _I, _P, _I, _I, _I, _I, _I, _P, _P],
    ("moe", "fused_experts"): [_P, _I, _P, _P, _P, _P, _P] + [_I] * 7 + [_P],
}
# Kernels that also take a cache of another dtype: (activation dtype, cache dtype) -> symbol suffix.
_MIXED_CACHE = {("paged_attention", "paged_attention"), ("layer_ops", "store_kv")}
_CACHE_SUFFIX = {(torch.float32, torch.float16): "f32_f16kv"}
_ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


class NativeKernels:
    """The compiled kernels of one variant; ``function(name, dtype)`` is missing where that did not build."""

    def __init__(self, variant: cpu_isa.KernelVariant):
        self.variant = variant
        # (name, activation dtype, cache dtype) -> function; the cache dtype is the activations' but
        # for `_MIXED_CACHE` kernels.
        self._functions: dict[tuple[str, torch.dtype, torch.dtype], object] = {}
        for library_name, name in _SIGNATURES:
            library = native_build.load(library_name, variant)
            if library is None:
                continue
            suffixes = {(dtype, dtype): suffix for dtype, suffix in _SUFFIX.items()}
            if (library_name, name) in _MIXED_CACHE:
                suffixes.update(_CACHE_SUFFIX)
            for (dtype, cache_dtype), suffix in suffixes.items():
                function = getattr(library, f"spyglass_{name}_{suffix}")
                function.argtypes = _SIGNATURES[(library_name, name)]
                function.restype = None
                self._functions[(name, dtype, cache_dtype)] = function

        self._complete = {
            dtype
            for dtype in _SUFFIX
            if all((name, dtype, dtype) in self._functions for _, name in _SIGNATURES)
        }

    def available(self, dtype: torch.dtype) -> bool:
        """Whether every kernel built for ``dtype``."""
        return dtype in self._complete

    def attends(self, dtype: torch.dtype, cache_dtype: torch.dtype) -> bool:
        """Whether attention and the KV store built for ``dtype`` activations over a ``cache_dtype`` cache."""
        return all((name, dtype, cache_dtype) in self._functions for _, name in _MIXED_CACHE)

    def function(self, name: str, dtype: torch.dtype, cache_dtype: torch.dtype | None = None):
        return self._functions[(name, dtype, cache_dtype or dtype)]

    def paged_attention(
        self,
        query,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        query_start_loc,
        scale: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Causal attention of every request's new tokens over its paged context, ``[tokens, heads, dim]``.

        Shapes and the optional sliding window and soft-cap as `torch_attention.paged_attention`, caches
        head-major ``[kv_heads, blocks, block_size, dim]``; query rows may be strided but each row's heads
        must be contiguous.
        """
        if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
            query = query.contiguous()
        block_tables = block_tables.to(torch.int32).contiguous()
        context_lens = context_lens.to(torch.int32).contiguous()
        query_start_loc = query_start_loc.to(torch.int32).contiguous()
        num_kv_heads, num_blocks, block_size, head_dim = k_cache.shape
        out = torch.empty(query.shape, dtype=query.dtype)
        self.function("paged_attention", query.dtype, k_cache.dtype)(
            query.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            block_tables.data_ptr(),
            context_lens.data_ptr(),
            query_start_loc.data_ptr(),
            block_tables.shape[0],
            query.shape[1],
            num_kv_heads,
            head_dim,
            num_blocks,
            block_size,
            block_tables.stride(0),
            query.stride(0),
            scale,
            sliding_window or 0,
            softcap or 0.0,
            torch.get_num_threads(),
            out.data_ptr(),
        )
        return out

    def add_rms_norm(self, x, residual, weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """`torch_norm_rope.add_rms_norm`: ``(rms_norm(x + residual) * weight, x + residual)``; rows may be strided."""
        num_tokens, width = x.shape
        out = torch.empty(num_tokens, width, dtype=x.dtype)
        summed = torch.empty(num_tokens, width, dtype=x.dtype)
        self.function("add_rms_norm", x.dtype)(
            x.data_ptr(),
            x.stride(0),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0),
            weight.data_ptr(),
            eps,
            num_tokens,
            width,
            torch.get_num_threads(),
            out.data_ptr(),
            summed.data_ptr(),
        )
        return out, summed

    def rotary_embedding_(self, x, positions, cos, sin) -> None:
        """`torch_norm_rope.rotary_embedding_`: rotate ``x [tokens, heads, dim]`` (dim contiguous) in place."""
        positions = positions.to(torch.int64).contiguous()
        num_tokens, num_heads, head_dim = x.shape
        self.function("rotary_embedding", x.dtype)(
            x.data_ptr(),
            x.stride(0),
            x.stride(1),
            num_tokens,
            num_heads,
            head_dim,
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            cos.stride(0),
            torch.get_num_threads(),
        )

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """`torch_norm_rope.silu_and_mul`: ``silu(gate) * up`` for a contiguous ``[tokens, 2 * width]``."""
        num_tokens, width = gate_up.shape[0], gate_up.shape[1] // 2
        gate_up = gate_up.contiguous()
        out = torch.empty(num_tokens, width, dtype=gate_up.dtype)
        self.function("silu_and_mul", gate_up.dtype)(
            gate_up.data_ptr(), num_tokens, width, torch.get_num_threads(), out.data_ptr()
        )
        return out

    def store_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        """`cpu_attention.store_kv`: key and value ``[tokens, kv_heads, dim]`` share one row stride (views of qkv)."""
        slot_mapping = slot_mapping.to(torch.int64).contiguous()
        num_kv_heads, num_blocks, block_size, head_dim = k_cache.shape
        self.function("store_kv", key.dtype, k_cache.dtype)(
            key.data_ptr(),
            value.data_ptr(),
            key.stride(0),
            slot_mapping.data_ptr(),
            key.shape[0],
            num_kv_heads,
            head_dim,
            num_blocks * block_size,
            torch.get_num_threads(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
        )

    def fused_experts(
        self, x, w13, w2, sorted_pairs, counts, topk_weights, top_k: int, activation: str
    ) -> torch.Tensor:
        """`torch_moe.fused_experts` given the pairs already sorted by expert (`torch_moe.sort_by_expert`);
        x's rows may be strided, the weights contiguous in x's dtype."""
        if x.stride(1) != 1:
            x = x.contiguous()
        sorted_pairs = sorted_pairs.to(torch.int64).contiguous()
        offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=offsets[1:])
        pair_weights = topk_weights.to(torch.float32).contiguous()
        num_experts, double_inter, hidden = w13.shape
        out = torch.empty(x.shape[0], hidden, dtype=x.dtype)
        self.function("fused_experts", x.dtype)(
            x.data_ptr(),
            x.stride(0),
            w13.data_ptr(),
            w2.data_ptr(),
            sorted_pairs.data_ptr(),
            offsets.data_ptr(),
            pair_weights.data_ptr(),
            x.shape[0],
            top_k,
            num_experts,
            hidden,
            double_inter // 2,
            _ACTIVATIONS[activation],
            torch.get_num_threads(),
            out.data_ptr(),
        )
        return out


@functools.cache
def for_variant(name: str) -> NativeKernels:
    """The kernels built for the variant called ``name`` (built now if needed; it must run on this CPU)."""
    variant = next((v for v in cpu_isa.kernel_variants() if v.name == name), None)
    if variant is None:
        raise ValueError(
            f"unknown kernel variant {name!r}; known: {[v.name for v in cpu_isa.kernel_variants()]}"
        )
    if variant not in cpu_isa.runnable_variants():
        raise ValueError(
            f"this CPU cannot run the {name} kernels (it runs {[v.name for v in cpu_isa.runnable_variants()]})"
        )
    return NativeKernels(variant)


@functools.cache
def default() -> NativeKernels:
    """The variant this CPU runs best, or the one ``$SPYGLASS_KERNEL_VARIANT`` names."""
    return for_variant(os.environ.get("SPYGLASS_KERNEL_VARIANT") or cpu_isa.best_variant().name)


def build() -> bool:
    """Compile (or load from the cache) every native kernel of the default variant now; whether they all loaded."""
    return default().available(torch.float32)


def available(dtype: torch.dtype) -> bool:
    """Whether the default variant's kernels run for ``dtype`` on this machine (builds them on first call)."""
    return dtype in _SUFFIX and default().available(dtype)


def attends(dtype: torch.dtype, cache_dtype: torch.dtype) -> bool:
    """`NativeKernels.attends` of the default variant (builds the kernels on first call)."""
    return default().attends(dtype, cache_dtype)


def paged_attention(*args, **kwargs) -> torch.Tensor:
    """`NativeKernels.paged_attention` of the default variant."""
    return default().paged_attention(*args, **kwargs)


def add_rms_norm(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """`NativeKernels.add_rms_norm` of the default variant."""
    return default().add_rms_norm(*args, **kwargs)


def rotary_embedding_(*args, **kwargs) -> None:
    """`NativeKernels.rotary_embedding_` of the default variant."""
    default().rotary_embedding_(*args, **kwargs)


def silu_and_mul(*args, **kwargs) -> torch.Tensor:
    """`NativeKernels.silu_and_mul` of the default variant."""
    return default().silu_and_mul(*args, **kwargs)


def fused_experts(*args, **kwargs) -> torch.Tensor:
    """`NativeKernels.fused_experts` of the default variant."""
    return default().fused_experts(*args, **kwargs)


def store_kv(*args, **kwargs) -> None:
    """`NativeKernels.store_kv` of the default variant."""
    default().store_kv(*args, **kwargs)
