"""Typed ctypes bindings for the block-quantized CPU matmul (native/quant_matmul.cpp).

Weights stay in GGUF blocks (Q4_0, Q4_1, Q8_0): ``data`` is a contiguous uint8 tensor ``[n, k / 32 *
block bytes]``, one weight row per tensor row. `pack` rearranges them once into the kernel's layout
(8 rows' blocks interleaved, the same number of bytes give or take the last group's padding), which
`matmul` multiplies. The variant used is the one `cpu_native.default`
picks (so ``SPYGLASS_KERNEL_VARIANT`` and the tests' variant fixtures apply here too).
Activations go in and out as float32; other dtypes are converted at the edge.
"""

import ctypes
import functools

import torch
from gguf import GGMLQuantizationType

from spyglass.kernels import cpu_isa, cpu_native, native_build

SUPPORTED_TYPES = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)
_P, _I = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "quant_packed_bytes": ([_I, _I, _I], _I),
    "quant_pack": ([_P, _I, _I, _I, _I, _P], None),
    "quant_matmul": ([_P, _P, _I, _I, _I, _I, _I, _P], None),
    "dequantize_rows": ([_P, _I, _I, _P, _I, _I, _P], None),
    "quant_use_amx": ([ctypes.c_int], ctypes.c_int),
}
# What AMX-INT8 tiles need; the AVX-512 builds multiply whole 16x16 tiles on them.
_AMX_FLAGS = frozenset({"amx_tile", "amx_int8"})


class QuantKernels:
    """The quantized-matmul kernels of one variant; ``functions`` is empty where they did not build.

    ``amx`` says whether steps of 16 rows and more multiply on AMX-INT8 tiles (an AVX-512 build on a
    CPU with AMX): the same bits as the vector path, about twice as fast.
    """

    def __init__(self, variant: cpu_isa.KernelVariant):
        self.variant = variant
        self.functions = {}
        self.amx = False
        library = native_build.load("quant_matmul", variant)
        if library is not None:
            for name, (argtypes, restype) in _SIGNATURES.items():
                function = getattr(library, f"spyglass_{name}")
                function.argtypes, function.restype = argtypes, restype
                self.functions[name] = function
            self.use_amx(cpu_isa.cpu_flags() >= _AMX_FLAGS)

    def use_amx(self, wanted: bool) -> bool:
        """Multiply whole tiles on AMX from now on if ``wanted`` and possible here; whether it is."""
        self.amx = bool(self.functions["quant_use_amx"](int(wanted)))
        return self.amx

    def pack(self, data: torch.Tensor, qtype: GGMLQuantizationType, n: int, k: int) -> torch.Tensor:
        """``data``'s ``n`` GGUF rows of ``k`` values in the layout `matmul` reads (uint8, 1-D)."""
        data = data.contiguous()
        packed = torch.empty(
            self.functions["quant_packed_bytes"](int(qtype), n, k), dtype=torch.uint8
        )
        self.functions["quant_pack"](
            data.data_ptr(), int(qtype), n, k, torch.get_num_threads(), packed.data_ptr()
        )
        return packed

    def matmul(
        self, x: torch.Tensor, packed: torch.Tensor, qtype: GGMLQuantizationType, n: int, k: int
    ) -> torch.Tensor:
        """``x [..., k] @ W.T`` as ``[..., n]`` in x's dtype, W being ``n`` rows of ``k`` values
        `pack`-ed into ``packed``. Activations are rounded to int8 per 32 values, as llama.cpp does."""
        # Reshaping and viewing 2-D tensors would cost ~3 us a call: most of a matmul at batch 1.
        x2 = x if x.dim() == 2 else x.reshape(-1, k)
        if x2.dtype != torch.float32 or not x2.is_contiguous():
            x2 = x2.to(torch.float32).contiguous()
        y = torch.empty(x2.shape[0], n, dtype=torch.float32)
        self.functions["quant_matmul"](
            x2.data_ptr(),
            packed.data_ptr(),
            int(qtype),
            x2.shape[0],
            n,
            k,
            torch.get_num_threads(),
            y.data_ptr(),
        )
        if x.dim() != 2:
            y = y.view(*x.shape[:-1], n)
        return y if x.dtype == torch.float32 else y.to(x.dtype)

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


def pack(*args, **kwargs) -> torch.Tensor:
    """`QuantKernels.pack` of the default variant."""
    return default().pack(*args, **kwargs)


def matmul(*args, **kwargs) -> torch.Tensor:
    """`QuantKernels.matmul` of the default variant."""
    return default().matmul(*args, **kwargs)


def dequantize_rows(*args, **kwargs) -> torch.Tensor:
    """`QuantKernels.dequantize_rows` of the default variant."""
    return default().dequantize_rows(*args, **kwargs)
