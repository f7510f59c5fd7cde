"""Typed ctypes bindings for the block-quantized CPU matmul (native/quant_matmul.cpp).

Weights stay in GGUF blocks (Q4_0, Q4_1, Q8_0): ``data`` is a contiguous uint8 tensor ``[n, k / 32 *
block bytes]``, one weight row per tensor row. The variant used is the one `cpu_native.default`
picks (so ``SPYGLASS_KERNEL_VARIANT`` and the tests' variant fixtures apply here too).
Activations go in and out as float32; other dtypes are converted at the edge.
"""

import ctypes
import functools

import torch
from gguf import GGMLQuantizationType

from spyglass.kernels import cpu_isa, cpu_native, native_build

SUPPORTED_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)
# From this many activation rows a float GEMM on the weight dequantized per call beats the int8 kernel
# (AVX2, one thread: the kernel is 1.16x the float GEMM's time at 64 rows, dequantize + GEMM 1.10x
# at 256 rows and 1.02x at 1024, where the kernel is 1.25x): prefill takes that path, decode the kernel.
LARGE_BATCH_ROWS = 128
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "quant_matmul": [_P, _P, _I, _I, _I, _I, _I, _P],
    "dequantize_rows": [_P, _I, _I, _P, _I, _I, _P],
}


class QuantKernels:
    """The quantized-matmul kernels of one variant; ``functions`` is empty where they did not build."""

    def __init__(self, variant: cpu_isa.KernelVariant):
        self.variant = variant
        self.functions = {}
        library = native_build.load("quant_matmul", variant)
        if library is not None:
            for name, argtypes in _SIGNATURES.items():
                function = getattr(library, f"spyglass_{name}")
                function.argtypes, function.restype = argtypes, None
                self.functions[name] = function

    def matmul(
        self, x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType, n: int, k: int
    ) -> torch.Tensor:
        """``x [..., k] @ W.T`` as ``[..., n]`` in x's dtype, W being ``n`` rows of ``k`` values in ``data``.

        Up to `LARGE_BATCH_ROWS` rows, the int8 kernel (activations rounded to int8 per 32 values);
        from there, float32 GEMM on the dequantized weight.
        """
        x2 = x.reshape(-1, k).to(torch.float32).contiguous()
        if x2.shape[0] >= LARGE_BATCH_ROWS:
            return (
                (x2 @ self.dequantize_rows(data, qtype, k).T).reshape(*x.shape[:-1], n).to(x.dtype)
            )
        y = torch.empty(x2.shape[0], n, dtype=torch.float32)
        self.functions["quant_matmul"](
            x2.data_ptr(),
            data.data_ptr(),
            int(qtype),
            x2.shape[0],
            n,
            k,
            torch.get_num_threads(),
            y.data_ptr(),
        )
        return y.reshape(*x.shape[:-1], n).to(x.dtype)

    def dequantize_rows(
        self,
        data: torch.Tensor,
        qtype: GGMLQuantizationType,
        k: int,
        row_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Float32 ``[len(row_ids), k]``: the chosen weight rows dequantized (every row when ``row_ids`` is None)."""
        if row_ids is not None:
            row_ids = row_ids.to(torch.int64).contiguous()
        num_rows = data.shape[0] if row_ids is None else row_ids.numel()
        out = torch.empty(num_rows, k, dtype=torch.float32)
        self.functions["dequantize_rows"](
            data.data_ptr(),
            int(qtype),
            k,
            None if row_ids is None else row_ids.data_ptr(),
            num_rows,
            torch.get_num_threads(),
            out.data_ptr(),
        )
        return out


@functools.cache
def _for_variant(variant: cpu_isa.KernelVariant) -> QuantKernels:
    return QuantKernels(variant)


def default() -> QuantKernels:
    """The kernels of the variant `cpu_native.default` chose."""
    return _for_variant(cpu_native.default().variant)


def available() -> bool:
    """Whether the quantized kernels run on this machine (builds them on first call)."""
    return bool(default().functions)


def matmul(*args, **kwargs) -> torch.Tensor:
    """`QuantKernels.matmul` of the default variant."""
    return default().matmul(*args, **kwargs)


def dequantize_rows(*args, **kwargs) -> torch.Tensor:
    """`QuantKernels.dequantize_rows` of the default variant."""
    return default().dequantize_rows(*args, **kwargs)
