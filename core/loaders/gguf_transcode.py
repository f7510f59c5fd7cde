"""GGUF quantized blocks of other types rewritten at load into the block types the CPU kernels multiply.

Q4_K_M files, the most common GGUF downloads, hold most matrices in Q4_K and some in Q6_K, and
Q5_0 where a row is not a multiple of 256 values (SmolLM2's 576); Q5_K_M, Q3_K_M, IQ4_XS and
the like hold others. The kernels multiply Q4_0, Q4_1 and Q8_0 (`cpu_quant.SUPPORTED_TYPES`);
rather than expand the rest to float (7x the memory for Q4_K), each is rewritten once into a
supported type, and the result is what the weight cache keeps:

- Q4_K -> Q4_1, value for value. A Q4_K super-block of 256 values has 8 sub-blocks of 32, each
  value ``d * scale_j * q - dmin * min_j`` with 4-bit q and 6-bit scale_j and min_j; that is a
  Q4_1 block (``d' * q + m'``) with ``d' = d * scale_j`` and ``m' = -dmin * min_j``. The only
  change is rounding d' and m' to float16 (relative error at most 2^-11, against the 1/15 of
  the range a 4-bit step is): 5 bits a weight instead of 4.5.
- Q5_0 -> Q8_0, value for value: ``d * (q - 16)`` with 5-bit q is int8 ``q - 16`` times the same
  d. 8.5 bits a weight instead of 5.5.
- Every other quantized type gguf can dequantize (Q6_K, Q5_K, Q5_1, Q3_K, Q2_K, the IQ types, ...)
  -> Q8_0: the values are requantized to int8 per 32 with one float16 scale, an error of at most
  half an int8 step (for Q6_K a quarter of its own step or less where a block's two scales are
  equal): 8.5 bits a weight, against 32 as floats.

Float tensors (F32, F16, BF16) are not blocks; the loader converts them to the model's dtype.
"""

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from spyglass.kernels.cpu_quant import SUPPORTED_TYPES

Q = GGMLQuantizationType
_EXACT = {Q.Q4_K: Q.Q4_1, Q.Q5_0: Q.Q8_0}
_FLOATS = {Q.F32, Q.F16, Q.BF16, Q.F64}
_Q4_K_BYTES, _SUB_BLOCKS, _SUB_BLOCK = 144, 8, 32


def target_type(qtype: GGMLQuantizationType) -> Q | None:
    """The type the kernels multiply that ``qtype`` blocks are kept as (see above; a supported type
    stays itself), or None for float tensors."""
    if qtype in SUPPORTED_TYPES:
        return qtype
    if qtype in _FLOATS or qtype not in GGML_QUANT_SIZES:
        return None
    return _EXACT.get(qtype, Q.Q8_0)


def transcode(blocks: np.ndarray, qtype: GGMLQuantizationType) -> tuple[np.ndarray, Q] | None:
    """``blocks`` (``[rows, row bytes]`` of ``qtype``, a type the kernels do not multiply) as
    ``target_type(qtype)`` blocks (see above), or None where that cannot be done (Q4_K scales that
    would overflow float16, rows that are not a multiple of 32 values)."""
    block_size, type_size = GGML_QUANT_SIZES.get(qtype, (0, 1))
    if blocks.shape[-1] // type_size * block_size % 32:
        return None
    if qtype == Q.Q4_K:
        return _q4_k_to_q4_1(blocks)
    if qtype == Q.Q5_0:
        return _q5_0_to_q8_0(blocks), Q.Q8_0
    if target_type(qtype) in (None, qtype):
        raise ValueError(f"{qtype.name} tensors are not blocks to transcode")
    return quantize(dequantize(blocks, qtype), Q.Q8_0), Q.Q8_0


def _q4_k_to_q4_1(blocks: np.ndarray) -> tuple[np.ndarray, Q] | None:
    rows = blocks.shape[0]
    supers = np.ascontiguousarray(blocks).reshape(rows, -1, _Q4_K_BYTES)
    d = supers[..., 0:2].copy().view(np.float16).astype(np.float32)
    dmin = supers[..., 2:4].copy().view(np.float16).astype(np.float32)
    scale, minimum = _scales_and_mins(supers[..., 4:16])
    sub_d, sub_m = d * scale, -dmin * minimum
    if max(np.abs(sub_d).max(), np.abs(sub_m).max()) > np.finfo(np.float16).max:
        return None
    # 4 chunks of 32 bytes: the low nibbles are sub-block 2c's 32 values, the high ones 2c + 1's.
    nibbles = supers[..., 16:].reshape(rows, -1, 4, 1, _SUB_BLOCK)
    values = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=3)
    values = values.reshape(rows, -1, _SUB_BLOCKS, _SUB_BLOCK)
    out = np.empty((*values.shape[:3], 20), dtype=np.uint8)
    out[..., 0:2] = sub_d.astype(np.float16)[..., None].view(np.uint8)
    out[..., 2:4] = sub_m.astype(np.float16)[..., None].view(np.uint8)
    # Q4_1 packs value i in the low nibble of byte i and value i + 16 in its high nibble.
    out[..., 4:] = values[..., :16] | (values[..., 16:] << 4)
    return out.reshape(rows, -1), Q.Q4_1


def _q5_0_to_q8_0(blocks: np.ndarray) -> np.ndarray:
    rows = blocks.shape[0]
    scales = np.ascontiguousarray(blocks).reshape(rows, -1, 22)[..., 0:2]
    d = scales.copy().view(np.float16).astype(np.float32)
    values = dequantize(blocks, Q.Q5_0).reshape(rows, -1, _SUB_BLOCK)
    # values are d * (q - 16) exactly (small integers times a float16 in float32), so this is q - 16.
    steps = np.divide(values, d, out=np.zeros_like(values), where=d != 0)
    out = np.empty((*values.shape[:2], 34), dtype=np.uint8)
    out[..., 0:2] = scales
    out[..., 2:] = np.rint(steps).astype(np.int8).view(np.uint8)
    return out.reshape(rows, -1)


def _scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 sub-blocks' 6-bit scales and mins from a Q4_K super-block's 12 bytes (as float32).

    Sub-blocks 0-3 take bytes 0-3 (scale) and 4-7 (min), low 6 bits; sub-blocks 4-7 take byte
    8-11's low nibble (scale) and high nibble (min), with the top 2 bits of bytes 0-3 and 4-7.
    """
    low, high, extra = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scale = np.concatenate([low & 63, (extra & 0x0F) | ((low >> 6) << 4)], axis=-1)
    minimum = np.concatenate([high & 63, (extra >> 4) | ((high >> 6) << 4)], axis=-1)
    return scale.astype(np.float32), minimum.astype(np.float32)
