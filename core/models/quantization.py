"""Weights kept in quantized blocks on the CPU: the `QuantizedWeight` type and the ``--quantization`` modes.

``auto`` keeps a GGUF file's Q4_0, Q4_1 and Q8_0 matrices in their blocks when the engine runs on
the CPU and the quantized kernels built (`kernels.cpu_quant`); ``none`` dequantizes everything at load;
``int8`` stores every matrix (projections, embedding, LM head) as Q8_0: weight-only int8 with one float16
scale per 32 values, for Hugging Face checkpoints and dequantized GGUF files alike.

``dual`` is for CPUs whose bf16 matmuls run on AMX: there blocks are fastest only for steps of a
few rows (they read a quarter of the bytes) and AMX multiplies a batch 4-6x faster than the int8
kernel. `with_dense_copies` gives each matrix a bf16 copy beside its blocks (`DualWeight`), when
that fits (`check_dense_copies`). It is not the default: a token's numbers then depend on how many
rows its step had (a prefix-cache hit changes that), so a seeded request is not reproduced bit for bit.
"""

import logging
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize

from spyglass.core.models.vision_config import VISION_PREFIXES
from spyglass.kernels import cpu_isa, cpu_quant

_BLOCK = 32
log = logging.getLogger("spyglass.engine")


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    """An ``[n, k]`` matrix in GGUF blocks: ``data`` is uint8 ``[n, row bytes]``, each row whole.

    Rows are independent (blocks run along k), so rows can be permuted, gathered and concatenated
    as raw bytes.
    """

    data: torch.Tensor
    qtype: GGMLQuantizationType

    @property
    def shape(self) -> tuple[int, int]:
        block_size, block_bytes = GGML_QUANT_SIZES[self.qtype]
        return self.data.shape[0], self.data.shape[1] // block_bytes * block_size

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def to(self, device: torch.device) -> "QuantizedWeight":
        """The weight on ``device``; only the CPU runs quantized kernels."""
        if torch.device(device).type != "cpu":
            raise ValueError("quantized weights run on the CPU only; use --quantization none")
        return self

    def dequantize(self) -> torch.Tensor:
        """The whole matrix as float32."""
        return cpu_quant.dequantize_rows(self.data, self.qtype, self.shape[1])

    def rows(self, row_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The rows ``row_ids`` dequantized to ``dtype`` (an embedding lookup)."""
        return cpu_quant.dequantize_rows(
            self.data, self.qtype, self.shape[1], row_ids.reshape(-1)
        ).to(dtype)


@dataclass(frozen=True, slots=True)
class DualWeight(QuantizedWeight):
    """Blocks, and the same matrix ``dense`` (dequantized, bf16) for steps of many rows."""

    dense: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + self.dense.nbytes


# Host memory that dense copies may take at most, as a share of what is available.
_DENSE_SHARE = 0.25


def check_dense_copies(weights: dict, dtype: torch.dtype) -> None:
    """Raise ``ValueError`` unless `with_dense_copies` can run here: in bf16, with copies that take
    at most a quarter of the memory available now. A CPU without AMX is named in a warning."""
    if dtype != torch.bfloat16:
        raise ValueError("--quantization dual keeps bf16 copies: it needs --dtype bfloat16")
    dense = sum(2 * weights[name].shape[0] * weights[name].shape[1] for name in _copied(weights))
    if not dense:
        raise ValueError("--quantization dual needs a GGUF file with Q4_0, Q4_1 or Q8_0 matrices")
    available = _available_memory()
    if dense > _DENSE_SHARE * available:
        raise ValueError(
            f"--quantization dual: bf16 copies take {dense / 2**30:.1f} GiB, more than a quarter of "
            f"the {available / 2**30:.1f} GiB available"
        )
    if "amx_bf16" not in cpu_isa.cpu_flags():
        log.warning(
            "--quantization dual: this CPU (%s) has no AMX; its bf16 matmuls may not beat the blocks",
            cpu_isa.describe(),
        )


def with_dense_copies(weights: dict, dtype: torch.dtype) -> dict:
    """``weights`` with each block matrix (experts' aside) as a `DualWeight` with a ``dtype`` copy."""
    copied = set(_copied(weights))
    return {
        name: DualWeight(w.data, w.qtype, w.dequantize().to(dtype)) if name in copied else w
        for name, w in weights.items()
    }


def _copied(weights: dict) -> list[str]:
    """The matrices that get a dense copy: blocks, but not a mixture's experts (its own kernels)."""
    return [
        name for name, w in weights.items() if type(w) is QuantizedWeight and "experts" not in name
    ]


def _available_memory() -> int:
    """Bytes of memory available now (MemAvailable), 0 when unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def from_gguf(data: np.ndarray, qtype: GGMLQuantizationType) -> QuantizedWeight:
    """A GGUF tensor's raw blocks ``[n, row bytes]``, copied out of the memory-mapped file."""
    return QuantizedWeight(torch.from_numpy(np.array(data, dtype=np.uint8)), qtype)


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """``weight [n, k]`` as Q8_0 blocks (gguf's own quantizer): int8 values, a float16 scale per 32."""
    values = weight.detach().to(torch.float32).numpy()
    return QuantizedWeight(
        torch.from_numpy(quantize(values, GGMLQuantizationType.Q8_0)), GGMLQuantizationType.Q8_0
    )


def resolve_mode(mode: str, device: torch.device) -> str:
    """The mode that applies on ``device``: ``auto`` becomes ``none`` off the CPU or without the kernels.

    Raises ``ValueError`` for ``int8`` and ``dual`` where the quantized kernels cannot run.
    """
    runs_here = device.type == "cpu" and cpu_quant.available()
    if mode in ("int8", "dual") and not runs_here:
        raise ValueError(
            f"--quantization {mode} needs the CPU and its compiled kernels (a C++ compiler)"
        )
    return "none" if mode == "auto" and not runs_here else mode


def lookup_rows(
    weight: torch.Tensor | QuantizedWeight, row_ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``weight[row_ids]`` in ``dtype``, for an embedding kept in float or in blocks."""
    return weight.rows(row_ids, dtype) if isinstance(weight, QuantizedWeight) else weight[row_ids]


def quantize_weights_int8(weights: dict[str, torch.Tensor]) -> dict:
    """``weights`` with every float matrix (projections, embedding, LM head) as Q8_0.

    Vectors (norms, biases), matrices whose width is not a multiple of 32, weights already
    quantized and a vision tower's and projector's weights (run by torch's float ops) are left
    as they are.
    """
    return {
        name: quantize_int8(w)
        if isinstance(w, torch.Tensor)
        and w.dim() == 2
        and w.shape[1] % _BLOCK == 0
        and not name.startswith(VISION_PREFIXES)
        else w
        for name, w in weights.items()
    }


def weight_bytes(weights: dict) -> int:
    """Bytes held by a checkpoint's weights, quantized or not."""
    return sum(w.nbytes for w in weights.values())


def cat_rows(weights: list) -> torch.Tensor | QuantizedWeight:
    """Stack matrices along their rows (q, k, v into qkv). Blocks of different types become Q8_0
    blocks (a part in another type requantized, within half an int8 step); blocks mixed with
    floats are dequantized to float."""
    if all(isinstance(w, torch.Tensor) for w in weights):
        return torch.cat(weights)
    qtypes = {getattr(w, "qtype", None) for w in weights}
    if len(qtypes) == 1 and all(isinstance(w, DualWeight) for w in weights):
        data, dense = torch.cat([w.data for w in weights]), torch.cat([w.dense for w in weights])
        return DualWeight(data, qtypes.pop(), dense)
    if len(qtypes) == 1:
        return QuantizedWeight(torch.cat([w.data for w in weights]), qtypes.pop())
    if None not in qtypes:  # e.g. a Q3_K_M file's q and k in Q4_0, v in Q5_1 (kept as Q8_0)
        q8_0 = GGMLQuantizationType.Q8_0
        parts = [w.data if w.qtype == q8_0 else quantize_int8(w.dequantize()).data for w in weights]
        return QuantizedWeight(torch.cat(parts), q8_0)
    dtype = next((w.dtype for w in weights if isinstance(w, torch.Tensor)), torch.float32)
    return torch.cat(
        [w if isinstance(w, torch.Tensor) else w.dequantize().to(dtype) for w in weights]
    )
