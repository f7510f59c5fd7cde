"""Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's image encoder: patches of two frames embedded by one
matmul (the checkpoint's 3D convolution; Qwen3-VL's adds learned position embeddings resampled
bilinearly to the image's grid), transformer blocks whose attention rotates q and k by each
patch's row and column (2D rope) and stays within its image (Qwen2.5-VL: within a window of it,
but in ``full_attention_layers``), then a merger: a norm, ``scale_factor`` x ``scale_factor``
patches concatenated and a two-layer GELU MLP into the language model's width. Qwen3-VL's
DeepStack mergers read the outputs of its ``deepstack_layers`` the same way (their norm after the
concatenation). Plain tensors, as the decoders are."""

import torch
import torch.nn.functional as F

from spyglass.core.models.clip_vision import TOWER, vision_activation
from spyglass.core.models.qwen_windows import image_segments
from spyglass.core.models.vision_config import VisionConfig

_ROPE_THETA = 10000.0


# Per tower: its MLP's linear layers, and its merger's norm and two linear layers.
_MLP_NAMES = {
    "qwen2_vl": ("fc1", "fc2"),
    "qwen2_5_vl": ("gate_proj", "up_proj", "down_proj"),
    "qwen3_vl": ("linear_fc1", "linear_fc2"),
}
_MERGER_NAMES = {
    "qwen2_vl": ("ln_q", "mlp.0", "mlp.2"),
    "qwen2_5_vl": ("ln_q", "mlp.0", "mlp.2"),
    "qwen3_vl": ("norm", "linear_fc1", "linear_fc2"),
}


def _mergers(vision: VisionConfig) -> list[str]:
    """The prefixes of the tower's merger and of its DeepStack mergers, in order."""
    deepstack = [f"{TOWER}.deepstack_merger_list.{i}" for i in range(len(vision.deepstack_layers))]
    return [f"{TOWER}.merger", *deepstack]


def qwen_vision_weight_names(vision: VisionConfig) -> set[str]:
    """The canonical names of the tower's and the mergers' parameters (the Hub's ``visual.``
    names under ``vision_tower.``). Qwen2-VL's and Qwen3-VL's norms are LayerNorms with biases,
    Qwen2.5-VL's RMSNorms; the MLPs are `_MLP_NAMES`; Qwen3-VL's patch embedding has a bias and
    its position embeddings a table."""
    rms = vision.tower == "qwen2_5_vl"
    norm = ("weight",) if rms else ("weight", "bias")
    both = ("weight", "bias")
    mlp = _MLP_NAMES[vision.tower]
    names = {f"{TOWER}.patch_embed.proj.weight"}
    if vision.position_grid:
        names |= {f"{TOWER}.patch_embed.proj.bias", f"{TOWER}.pos_embed.weight"}
    for merger in _mergers(vision):
        norm_name, first, second = _MERGER_NAMES[vision.tower]
        names |= {f"{merger}.{norm_name}.{p}" for p in norm}
        names |= {f"{merger}.{layer}.{p}" for layer in (first, second) for p in both}
    for i in range(vision.num_hidden_layers):
        block = f"{TOWER}.blocks.{i}"
        names |= {f"{block}.norm{n}.{p}" for n in (1, 2) for p in norm}
        names |= {f"{block}.attn.{m}.{p}" for m in ("qkv", "proj") for p in both}
        names |= {f"{block}.mlp.{m}.{p}" for m in mlp for p in both}
    return names


class _Norm:
    """Qwen2-VL's LayerNorm (with a bias) or Qwen2.5-VL's RMSNorm (no bias; in float32)."""

    __slots__ = ("bias", "eps", "weight")

    def __init__(self, weights: dict[str, torch.Tensor], prefix: str, eps: float):
        self.weight, self.bias, self.eps = (
            weights[f"{prefix}.weight"],
            weights.get(f"{prefix}.bias"),
            eps,
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def _pair(weights: dict[str, torch.Tensor], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    return weights[f"{prefix}.weight"], weights[f"{prefix}.bias"]


class _Block:
    """One pre-norm block: attention within segments, then the MLP."""

    __slots__ = ("act", "mlp", "norm1", "norm2", "num_heads", "proj", "qkv")

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], prefix: str):
        self.norm1 = _Norm(weights, f"{prefix}.norm1", vision.layer_norm_eps)
        self.norm2 = _Norm(weights, f"{prefix}.norm2", vision.layer_norm_eps)
        self.qkv, self.proj = (
            _pair(weights, f"{prefix}.attn.qkv"),
            _pair(weights, f"{prefix}.attn.proj"),
        )
        self.mlp = [_pair(weights, f"{prefix}.mlp.{name}") for name in _MLP_NAMES[vision.tower]]
        self.act = vision_activation(vision.hidden_act)
        self.num_heads = vision.num_attention_heads

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, groups: list[torch.Tensor]
    ):
        """The block's output for ``x [patches, width]``; patches attend within their segment
        (``groups``: `qwen_windows.segment_groups`)."""
        patches, width = x.shape
        qkv = F.linear(self.norm1(x), *self.qkv).view(patches, 3, self.num_heads, -1)
        q, k = (_rotated(t, cos, sin) for t in (qkv[:, 0], qkv[:, 1]))
        v = qkv[:, 2]
        out = torch.empty_like(v)
        for index in groups:
            heads = [t[index].transpose(1, 2) for t in (q, k, v)]
            out[index] = F.scaled_dot_product_attention(*heads).transpose(1, 2)
        x = x + F.linear(out.reshape(patches, width), *self.proj)
        h = self.norm2(x)
        if len(self.mlp) == 2:
            (w1, b1), (w2, b2) = self.mlp
            return x + F.linear(self.act(F.linear(h, w1, b1)), w2, b2)
        gate, up, down = self.mlp
        return x + F.linear(self.act(F.linear(h, *gate)) * F.linear(h, *up), *down)


class _Merger:
    """A merger: its norm, ``scale_factor`` x ``scale_factor`` patches concatenated (DeepStack's
    norm after that), then a two-layer GELU MLP."""

    __slots__ = ("fc1", "fc2", "norm", "norm_after", "width")

    def __init__(self, vision: VisionConfig, weights, prefix: str, norm_after: bool):
        norm, first, second = _MERGER_NAMES[vision.tower]
        self.norm = _Norm(weights, f"{prefix}.{norm}", vision.layer_norm_eps)
        self.fc1, self.fc2 = (
            _pair(weights, f"{prefix}.{first}"),
            _pair(weights, f"{prefix}.{second}"),
        )
        self.width = vision.hidden_size * vision.scale_factor**2
        self.norm_after = norm_after

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The tokens ``[patches / scale_factor², out]`` of ``x [patches, hidden]``."""
        if self.norm_after:
            merged = self.norm(x.reshape(-1, self.width))
        else:
            merged = self.norm(x).view(-1, self.width)
        return F.linear(F.gelu(F.linear(merged, *self.fc1)), *self.fc2)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x [patches, heads, head_dim]`` rotated (rotate-half) in float32, back in its dtype."""
    half = x.shape[-1] // 2
    x32 = x.float()
    turned = torch.cat([-x32[..., half:], x32[..., :half]], dim=-1)
    return (x32 * cos[:, None] + turned * sin[:, None]).to(x.dtype)


class QwenVisionEncoder:
    """Patches to image tokens (see the module). Takes the `qwen_vision_weight_names` weights
    (other keys are ignored), on ``device`` in ``dtype``."""

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], device, dtype):
        self.vision = vision
        self.dtype = dtype
        w = {
            name: weights[name].to(device=device, dtype=dtype)
            for name in qwen_vision_weight_names(vision)
        }
        self.patch_embed = w[f"{TOWER}.patch_embed.proj.weight"].reshape(vision.hidden_size, -1)
        self.patch_bias = w.get(f"{TOWER}.patch_embed.proj.bias")
        self.pos_embed = w.get(f"{TOWER}.pos_embed.weight")
        self.blocks = [
            _Block(vision, w, f"{TOWER}.blocks.{i}") for i in range(vision.num_hidden_layers)
        ]
        main, *deepstack = _mergers(vision)
        self.merger = _Merger(vision, w, main, norm_after=False)
        self.deepstack = [_Merger(vision, w, prefix, norm_after=True) for prefix in deepstack]
        quarter = vision.hidden_size // vision.num_attention_heads // 2
        self.inv_freq = 1.0 / (
            _ROPE_THETA
            ** (torch.arange(0, quarter, 2, dtype=torch.float32, device=device) / quarter)
        )

    @torch.inference_mode()
    def __call__(self, patches: torch.Tensor, grids: list[tuple[int, int]]) -> torch.Tensor:
        """The image tokens ``[tokens, projector_size]`` in the encoder's dtype of the images
        whose patches ``[patches, patch_pixels]`` follow one another, image ``i`` a grid of
        ``grids[i]`` (rows, columns) patches in the processor's order (merged squares together).
        With DeepStack, each token's DeepStack features follow its own, side by side
        (``[tokens, projector_size * (1 + len(deepstack_layers))]``)."""
        vision = self.vision
        x = F.linear(
            patches.to(device=self.patch_embed.device, dtype=self.dtype),
            self.patch_embed,
            self.patch_bias,
        )
        if self.pos_embed is not None:
            x = x + self._position_embeddings(grids).to(x.dtype)
        segments = image_segments(grids, vision, x.device)
        angles = segments.positions[..., None].float() * self.inv_freq
        angles = angles.flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x, cos, sin = (t[segments.order] for t in (x, cos, sin))
        features = []
        for i, block in enumerate(self.blocks):
            full = not vision.window_size or i in vision.full_attention_layers
            x = block(x, cos, sin, segments.images if full else segments.windows)
            if i in vision.deepstack_layers:
                merger = self.deepstack[vision.deepstack_layers.index(i)]
                features.append(merger(x))
        tokens = torch.cat([self.merger(x), *features], dim=-1)
        return tokens[segments.token_restore]

    def _position_embeddings(self, grids: list[tuple[int, int]]) -> torch.Tensor:
        """Qwen3-VL's ``[patches, hidden]``: its table resampled (bilinear, corners aligned, in
        float32) to each image's grid, in the processor's order (merged squares together)."""
        side, merge = self.vision.position_grid, self.vision.scale_factor
        table = self.pos_embed.float().view(side, side, -1).permute(2, 0, 1)[None]
        per_image = []
        for rows, cols in grids:
            grid = F.interpolate(table, size=(rows, cols), mode="bilinear", align_corners=True)
            grid = grid[0].permute(1, 2, 0).reshape(rows // merge, merge, cols // merge, merge, -1)
            per_image.append(grid.permute(0, 2, 1, 3, 4).reshape(rows * cols, -1))
        return torch.cat(per_image)
