"""Rotary position embeddings, with llama3-style frequency scaling."""

import math

import torch


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """The ``head_dim / 2`` rotary frequencies, rescaled as llama3 does when ``scaling`` says so."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if rope_type in (None, "default"):
        return inv_freq.float()
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope scaling {rope_type!r}")
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
    return torch.where(medium, smoothed, scaled).float()


class RotaryEmbedding:
    """Precomputed cos/sin tables ``[max_positions, head_dim]`` (HF's rotate-half layout, both halves equal).

    The backend's ``rotary_embedding_`` applies them to the query and key heads.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None, dtype, device):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().to(dtype=dtype, device=device)
        self.sin = angles.sin().to(dtype=dtype, device=device)
