"""Rotary position embeddings, with the llama3, linear, YaRN and LongRoPE scalings as transformers
computes them, and Qwen2-VL's multimodal rope (`mrope`)."""

import math
from dataclasses import dataclass

import torch

# The rope_type values (besides "default") that rotation_angles computes. "mrope" rotates by the
# default frequencies; `mrope.MultimodalRotaryEmbedding` gives each of its sections its own axis.
SCALING_TYPES = ("linear", "llama3", "yarn", "longrope", "mrope")


def _default_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low_freq_factor = scaling.get("low_freq_factor", 1.0)
    high_freq_factor = scaling.get("high_freq_factor", 4.0)
    original_len = scaling.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = original_len / low_freq_factor
    high_freq_wavelen = original_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(
    head_dim: int, theta: float, scaling: dict, max_positions: int
) -> tuple[torch.Tensor, float]:
    """YaRN: extrapolate fast-rotating dimensions, interpolate slow ones, blend linearly in between."""
    factor = scaling.get("factor") or max_positions / scaling["original_max_position_embeddings"]
    original_len = scaling.get("original_max_position_embeddings", max_positions)
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    ramp = (
        (torch.arange(head_dim // 2, dtype=torch.float64) - low) / max(high - low, 0.001)
    ).clamp(0, 1)
    inv_freq = _default_frequencies(head_dim, theta)
    extrapolated = 1 - ramp
    inv_freq = inv_freq / factor * (1 - extrapolated) + inv_freq * extrapolated
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        both = mscale and mscale_all_dim
        attention_factor = get_mscale(factor)
        if both:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
    return inv_freq, attention_factor


def _longrope_angles(
    head_dim: int, theta: float, scaling: dict, max_positions: int
) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3): positions below ``original_max_position_embeddings`` rotate by the short factors,
    later ones by the long factors. (transformers switches a whole forward pass to the long factors once
    any position passes that length; per position, as here, keeps earlier cached keys valid.)"""
    original_len = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or max_positions / original_len
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_len))
        )
    base = _default_frequencies(head_dim, theta)
    positions = torch.arange(max_positions, dtype=torch.float32)
    short = torch.outer(
        positions, (base / torch.tensor(scaling["short_factor"], dtype=torch.float64)).float()
    )
    long = torch.outer(
        positions, (base / torch.tensor(scaling["long_factor"], dtype=torch.float64)).float()
    )
    return torch.where(positions.unsqueeze(1) < original_len, short, long), attention_factor


def rotation_angles(
    head_dim: int, max_positions: int, theta: float, scaling: dict | None
) -> tuple[torch.Tensor, float]:
    """``([max_positions, head_dim / 2] angles, attention factor)``: each position's rotation per frequency,
    and the factor transformers multiplies cos and sin by (1 except for YaRN and LongRoPE)."""
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    attention_factor = 1.0
    if rope_type in (None, "default", "mrope"):
        inv_freq = _default_frequencies(head_dim, theta)
    elif rope_type == "llama3":
        inv_freq = _llama3(_default_frequencies(head_dim, theta), scaling)
    elif rope_type == "linear":
        inv_freq = _default_frequencies(head_dim, theta) / scaling["factor"]
    elif rope_type == "yarn":
        inv_freq, attention_factor = _yarn(head_dim, theta, scaling, max_positions)
    elif rope_type == "longrope":
        return _longrope_angles(head_dim, theta, scaling, max_positions)
    else:
        raise ValueError(f"unsupported rope scaling {rope_type!r}")
    return torch.outer(
        torch.arange(max_positions, dtype=torch.float32), inv_freq.float()
    ), attention_factor


@dataclass(frozen=True, slots=True)
class RotaryTables:
    """What a step's attention rotates by: each token's row of the ``cos`` and ``sin`` tables
    (``[rows, head_dim]``) is ``positions[token]``; the backend's ``rotary_embedding_`` reads
    them."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


class RotaryEmbedding:
    """Precomputed cos/sin tables ``[max_positions, head_dim]`` (HF's rotate-half layout, both halves equal).

    `at` gives a step's tables; the backend's ``rotary_embedding_`` applies them to the query
    and key heads.
    """

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict | None, dtype, device
    ):
        angles, attention_factor = rotation_angles(head_dim, max_positions, theta, scaling)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = (angles.cos() * attention_factor).to(dtype=dtype, device=device)
        self.sin = (angles.sin() * attention_factor).to(dtype=dtype, device=device)

    def at(self, positions: torch.Tensor) -> RotaryTables:
        """The tables for a step whose tokens sit at ``positions [tokens]``."""
        return RotaryTables(positions, self.cos, self.sin)
