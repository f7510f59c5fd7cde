"""Linear layers: pre-packed for oneDNN when that pays (bf16 on CPU), or multiplied in quantized blocks."""

import torch
import torch.nn.functional as F

from spyglass.core.models.quantization import DualWeight, QuantizedWeight
from spyglass.kernels import cpu_isa, cpu_quant


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and cpu_isa.can_prepack_bf16()
    )


class Linear:
    """``y = x @ weight.T + bias``.

    On CPU in bf16 the weight is reordered once into oneDNN's blocked layout (for AMX or
    AVX512-BF16), which skips the per-call reorder F.linear pays: 10-30% faster at decode batch
    sizes on the machines measured. Only where oneDNN supports it (`cpu_isa.can_prepack_bf16`);
    other CPUs, devices and dtypes use F.linear unchanged.
    """

    __slots__ = ("bias", "packed", "weight")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, batch_hint: int = 64
    ):
        self.bias = bias
        self.packed = _can_pack(weight)
        self.weight = (
            torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint) if self.packed else weight
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


class QuantizedLinear:
    """``y = x @ weight.T + bias`` with the weight kept in GGUF blocks (`QuantizedWeight`), on the CPU.

    The blocks are repacked once into the kernel's interleaved layout (`cpu_quant.pack`, as many
    bytes); the GGUF rows are not kept.
    """

    __slots__ = ("bias", "kernels", "packed", "qtype", "shape")

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None):
        self.shape = weight.shape
        self.qtype = weight.qtype
        self.kernels = cpu_quant.default()
        self.packed = self.kernels.pack(weight.data, weight.qtype, *self.shape)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.kernels.matmul(x, self.packed, self.qtype, *self.shape)
        return y if self.bias is None else y + self.bias


class DualLinear:
    """``y = x @ weight.T + bias`` from blocks for steps of fewer than `DENSE_FROM_ROWS` rows, from
    the bf16 copy (oneDNN, on AMX) for more (`DualWeight`)."""

    # At 8 rows the int8 kernel and AMX take about as long for the default model's matrices;
    # below, reading 4-bit blocks wins (a step of 1 row: 9.7 vs 19.3 ms); above, AMX (64 rows: 4.5x).
    DENSE_FROM_ROWS = 8

    __slots__ = ("blocks", "dense")

    def __init__(self, weight: DualWeight, bias: torch.Tensor | None = None):
        self.blocks = QuantizedLinear(weight, bias)
        self.dense = Linear(weight.dense, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        return (self.dense if rows >= self.DENSE_FROM_ROWS else self.blocks)(x)


def make_linear(
    weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None
) -> Linear | QuantizedLinear | DualLinear:
    """The linear layer for ``weight``: `DualLinear` for blocks with a dense copy, `QuantizedLinear`
    for blocks, `Linear` for a float tensor."""
    if isinstance(weight, DualWeight):
        return DualLinear(weight, bias)
    return (
        QuantizedLinear(weight, bias)
        if isinstance(weight, QuantizedWeight)
        else Linear(weight, bias)
    )
