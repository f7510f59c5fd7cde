"""Mistral 3's image encoder: Pixtral's tower (a patch convolution, an RMSNorm, pre-norm layers
whose attention rotates q and k by each patch's row and column, 2D rope in Pixtral's own layout,
and stays within its image; gated MLPs), then the projector: an RMSNorm, each
``scale_factor`` x ``scale_factor`` square of patches merged by a learned linear layer, and a
two-layer GELU MLP into the language model's width. Plain tensors, as the decoders are."""

import torch
import torch.nn.functional as F

from spyglass.core.models.clip_vision import PROJECTOR, TOWER, vision_activation
from spyglass.core.models.qwen_windows import segment_groups
from spyglass.core.models.vision_config import VisionConfig

_LAYERS = f"{TOWER}.transformer.layers"


def pixtral_weight_names(vision: VisionConfig) -> set[str]:
    """The canonical names of the tower's and the projector's parameters."""
    names = {f"{TOWER}.patch_conv.weight", f"{TOWER}.ln_pre.weight"}
    names |= {f"{PROJECTOR}.norm.weight", f"{PROJECTOR}.patch_merger.merging_layer.weight"}
    params = ("weight", "bias") if vision.projector_bias else ("weight",)
    names |= {f"{PROJECTOR}.linear_{n}.{p}" for n in (1, 2) for p in params}
    for i in range(vision.num_hidden_layers):
        layer = f"{_LAYERS}.{i}"
        names |= {f"{layer}.attention_norm.weight", f"{layer}.ffn_norm.weight"}
        names |= {f"{layer}.attention.{p}_proj.weight" for p in "qkvo"}
        names |= {f"{layer}.feed_forward.{p}_proj.weight" for p in ("gate", "up", "down")}
    return names


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, rounded back before the weight (as transformers' Mistral norms)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [patches, heads, head_dim]`` rotated (rotate-half)."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None] + turned * sin[:, None]


class _Layer:
    """One pre-norm layer: attention within each image, then the gated MLP."""

    __slots__ = (
        "act",
        "attention_norm",
        "down",
        "eps",
        "ffn_norm",
        "gate",
        "num_heads",
        "o",
        "qkv",
        "up",
    )

    def __init__(self, vision: VisionConfig, w: dict[str, torch.Tensor], prefix: str):
        self.attention_norm = w[f"{prefix}.attention_norm.weight"]
        self.ffn_norm = w[f"{prefix}.ffn_norm.weight"]
        self.qkv = torch.cat([w[f"{prefix}.attention.{p}_proj.weight"] for p in "qkv"])
        self.o = w[f"{prefix}.attention.o_proj.weight"]
        self.gate, self.up, self.down = (
            w[f"{prefix}.feed_forward.{p}_proj.weight"] for p in ("gate", "up", "down")
        )
        self.act = vision_activation(vision.hidden_act)
        self.eps = vision.layer_norm_eps
        self.num_heads = vision.num_attention_heads

    def __call__(self, x, cos, sin, groups: list[torch.Tensor]) -> torch.Tensor:
        patches, width = x.shape
        qkv = F.linear(_rms_norm(x, self.attention_norm, self.eps), self.qkv)
        q, k, v = qkv.view(patches, 3, self.num_heads, -1).unbind(1)
        q, k = _rotated(q, cos, sin), _rotated(k, cos, sin)
        out = torch.empty_like(v)
        for index in groups:
            heads = [t[index].transpose(1, 2) for t in (q, k, v)]
            out[index] = F.scaled_dot_product_attention(*heads).transpose(1, 2)
        x = x + F.linear(out.reshape(patches, width), self.o)
        h = _rms_norm(x, self.ffn_norm, self.eps)
        return x + F.linear(self.act(F.linear(h, self.gate)) * F.linear(h, self.up), self.down)


class PixtralVisionEncoder:
    """Images (each ``[1, channels, height, width]``, sides in whole merged patches) to their
    prompt tokens ``[rows * columns, text_hidden]``, merged patches row by row. Takes the
    `pixtral_weight_names` weights (other keys are ignored), on ``device`` in ``dtype``."""

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], device, dtype):
        self.vision = vision
        self.dtype = dtype
        w = {n: weights[n].to(device=device, dtype=dtype) for n in pixtral_weight_names(vision)}
        self.patch_conv = w[f"{TOWER}.patch_conv.weight"]
        self.ln_pre = w[f"{TOWER}.ln_pre.weight"]
        self.layers = [_Layer(vision, w, f"{_LAYERS}.{i}") for i in range(vision.num_hidden_layers)]
        self.norm = w[f"{PROJECTOR}.norm.weight"]
        self.merging = w[f"{PROJECTOR}.patch_merger.merging_layer.weight"]
        self.projector_act = vision_activation(vision.projector_act)
        self.projector = [
            (w[f"{PROJECTOR}.linear_{n}.weight"], w.get(f"{PROJECTOR}.linear_{n}.bias"))
            for n in (1, 2)
        ]
        head_dim = vision.hidden_size // vision.num_attention_heads
        steps = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
        inv_freq = 1.0 / (vision.rope_theta**steps)
        # Pixtral's axial layout: rows turn the even frequencies, columns the odd ones.
        self.row_freq, self.col_freq = inv_freq[0::2], inv_freq[1::2]

    @torch.inference_mode()
    def __call__(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's prompt tokens, in the encoder's dtype."""
        vision = self.vision
        grids, patches, angles = [], [], []
        for pixels in images:
            x = F.conv2d(
                pixels.to(device=self.patch_conv.device, dtype=self.dtype),
                self.patch_conv,
                stride=vision.patch_size,
            )[0]
            rows, cols = x.shape[1:]
            grids.append((rows, cols))
            patches.append(x.flatten(1).t())
            row, col = torch.meshgrid(
                torch.arange(rows, device=x.device),
                torch.arange(cols, device=x.device),
                indexing="ij",
            )
            turns = [row.flatten()[:, None] * self.row_freq, col.flatten()[:, None] * self.col_freq]
            angles.append(torch.cat(turns, dim=-1))
        x = _rms_norm(torch.cat(patches), self.ln_pre, vision.layer_norm_eps)
        angle = torch.cat(angles)
        angle = torch.cat([angle, angle], dim=-1)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        bounds = [0]
        for rows, cols in grids:
            bounds.append(bounds[-1] + rows * cols)
        groups = segment_groups(bounds, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, groups)
        x = _rms_norm(x, self.norm, vision.projector_norm_eps)
        (w1, b1), (w2, b2) = self.projector
        tokens = []
        for (rows, cols), features in zip(grids, x.split([r * c for r, c in grids])):
            merged = F.linear(self._merged(features, rows, cols), self.merging)
            tokens.append(F.linear(self.projector_act(F.linear(merged, w1, b1)), w2, b2))
        return tokens

    def _merged(self, features: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        """``[rows * cols / m², dim * m²]``: each ``m`` x ``m`` square of an image's patches (row
        by row), its features channel by channel, each channel's square row by row (the
        projector's ``unfold``)."""
        m, dim = self.vision.scale_factor, features.shape[-1]
        grid = features.view(rows // m, m, cols // m, m, dim).permute(0, 2, 4, 1, 3)
        return grid.reshape(rows // m * (cols // m), dim * m * m)
