"""LLaVA's image encoder: a CLIP or SigLIP vision tower read out at one hidden layer, then the
two-layer MLP projector into the language model's embedding space. Plain tensors, as the
decoders are."""

import functools

import torch
import torch.nn.functional as F

from spyglass.core.models.vision_config import FEATURE_SELECTS, VisionConfig

TOWER = "vision_tower"
PROJECTOR = "multi_modal_projector"
IMAGE_NEWLINE = "image_newline"

# HF activation name -> the function (gelu_new is HF's own code for the same tanh approximation).
_ACTIVATIONS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def vision_activation(name: str):
    """The function HF calls ``name``; ValueError for one this encoder does not know."""
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"unsupported vision activation {name!r}; supported: {', '.join(_ACTIVATIONS)}"
        )
    return _ACTIVATIONS[name]


# SigLIP's attention-pooling head: in its checkpoints, never run by LLaVA.
_SIGLIP_HEAD = (
    "probe",
    "attention.in_proj_weight",
    "attention.in_proj_bias",
    "attention.out_proj.weight",
    "attention.out_proj.bias",
    "layernorm.weight",
    "layernorm.bias",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
)


def vision_weight_names(vision: VisionConfig) -> set[str]:
    """The canonical names of the tower's and the projector's parameters: transformers' in-memory
    ``LlavaModel`` names without the leading ``model.`` (Idefics3's tower is named as SigLIP's,
    its projection ``multi_modal_projector.proj.weight``, Gemma 3's its projector's norm and
    projection; LLaVA-NeXT adds ``image_newline``).
    ``post_layernorm`` and SigLIP's head are among them (checkpoints have them) though LLaVA
    never applies them."""
    clip = vision.tower == "clip"
    names = {
        f"{TOWER}.embeddings.patch_embedding.weight",
        f"{TOWER}.embeddings.position_embedding.weight",
        f"{TOWER}.post_layernorm.weight",
        f"{TOWER}.post_layernorm.bias",
    }
    if clip:
        names |= {
            f"{TOWER}.embeddings.class_embedding",
            f"{TOWER}.pre_layrnorm.weight",
            f"{TOWER}.pre_layrnorm.bias",
        }
    else:
        names.add(f"{TOWER}.embeddings.patch_embedding.bias")
    if vision.use_head:
        names |= {f"{TOWER}.head.{name}" for name in _SIGLIP_HEAD}
    for i in range(vision.num_hidden_layers):
        modules = ["layer_norm1", "layer_norm2", "mlp.fc1", "mlp.fc2"]
        modules += [f"self_attn.{p}_proj" for p in ("q", "k", "v", "out")]
        names |= {
            f"{TOWER}.encoder.layers.{i}.{m}.{p}" for m in modules for p in ("weight", "bias")
        }
    if vision.tower == "idefics3":
        return names | {f"{PROJECTOR}.proj.weight"}
    if vision.tower == "gemma3":
        return names | {
            f"{PROJECTOR}.mm_soft_emb_norm.weight",
            f"{PROJECTOR}.mm_input_projection_weight",
        }
    params = ("weight", "bias") if vision.projector_bias else ("weight",)
    names |= {f"{PROJECTOR}.linear_{n}.{p}" for n in (1, 2) for p in params}
    return names | {IMAGE_NEWLINE} if vision.grid_pinpoints else names


def tower_weights(
    vision: VisionConfig,
    weights: dict[str, torch.Tensor],
    device,
    dtype,
    unused: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """The `vision_weight_names` of ``weights`` but those starting with one of ``unused``, on
    ``device`` in ``dtype``."""
    return {
        name: weights[name].to(device=device, dtype=dtype)
        for name in vision_weight_names(vision)
        if not (unused and name.startswith(unused))
    }


class ClipEncoderLayer:
    """One pre-LayerNorm transformer layer of the tower: full (unmasked) attention, then the MLP."""

    __slots__ = ("act", "eps", "fc1", "fc2", "norm1", "norm2", "num_heads", "out_proj", "qkv")

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], prefix: str):
        def pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
            return weights[f"{prefix}.{name}.weight"], weights[f"{prefix}.{name}.bias"]

        self.norm1, self.norm2 = pair("layer_norm1"), pair("layer_norm2")
        # q, k and v fused: one matmul per layer instead of three.
        q, k, v = (pair(f"self_attn.{p}_proj") for p in "qkv")
        self.qkv = torch.cat([q[0], k[0], v[0]]), torch.cat([q[1], k[1], v[1]])
        self.out_proj = pair("self_attn.out_proj")
        self.fc1, self.fc2 = pair("mlp.fc1"), pair("mlp.fc2")
        self.act = vision_activation(vision.hidden_act)
        self.eps = vision.layer_norm_eps
        self.num_heads = vision.num_attention_heads

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output for ``x [images, positions, hidden]``."""
        images, positions, hidden = x.shape
        h = F.layer_norm(x, (hidden,), *self.norm1, self.eps)
        qkv = F.linear(h, *self.qkv).view(images, positions, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5)
        x = x + F.linear(attn.transpose(1, 2).reshape(images, positions, hidden), *self.out_proj)
        h = F.layer_norm(x, (hidden,), *self.norm2, self.eps)
        return x + F.linear(self.act(F.linear(h, *self.fc1)), *self.fc2)


class ClipVisionEncoder:
    """Pixels to image tokens: the patch (and CLIP's class) embeddings, CLIP's ``pre_layrnorm``,
    the encoder layers up to HF's ``hidden_states[feature_layer]`` (the rest never run), the
    first position dropped unless ``feature_select`` is ``full``, then the projector. Takes the
    `vision_weight_names` weights (other keys are ignored) and keeps only those it uses, on
    ``device`` in ``dtype``."""

    def __init__(self, vision: VisionConfig, weights: dict[str, torch.Tensor], device, dtype):
        num_states = vision.num_hidden_layers + 1  # hidden_states[0] is the embeddings' output
        if not -num_states <= vision.feature_layer < num_states:
            raise ValueError(
                f"feature_layer {vision.feature_layer} is outside the tower's {num_states} hidden states"
            )
        if vision.feature_select not in FEATURE_SELECTS:
            raise ValueError(
                f"unknown feature_select {vision.feature_select!r}; known: {', '.join(FEATURE_SELECTS)}"
            )
        self.vision = vision
        self.dtype = dtype
        unused = (f"{TOWER}.post_layernorm", f"{TOWER}.head.", IMAGE_NEWLINE)
        w = tower_weights(vision, weights, device, dtype, unused)
        # CLIP's alone: SigLIP has neither (None).
        self.class_embedding = w.get(f"{TOWER}.embeddings.class_embedding")
        self.pre_norm = w.get(f"{TOWER}.pre_layrnorm.weight"), w.get(f"{TOWER}.pre_layrnorm.bias")
        self.patch_embedding = (
            w[f"{TOWER}.embeddings.patch_embedding.weight"],
            w.get(f"{TOWER}.embeddings.patch_embedding.bias"),  # SigLIP's alone
        )
        self.position_embedding = w[f"{TOWER}.embeddings.position_embedding.weight"]
        num_layers = vision.feature_layer % num_states
        self.layers = [
            ClipEncoderLayer(vision, w, f"{TOWER}.encoder.layers.{i}") for i in range(num_layers)
        ]
        self.projector = [
            (w[f"{PROJECTOR}.linear_{n}.weight"], w.get(f"{PROJECTOR}.linear_{n}.bias"))
            for n in (1, 2)
        ]
        self.projector_act = vision_activation(vision.projector_act)

    @torch.inference_mode()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """The image tokens ``[images, tokens_per_tile, text_hidden]`` in the encoder's dtype for
        ``pixel_values [images, channels, image_size, image_size]``."""
        vision = self.vision
        x = pixel_values.to(device=self.position_embedding.device, dtype=self.dtype)
        x = F.conv2d(x, *self.patch_embedding, stride=vision.patch_size).flatten(2).transpose(1, 2)
        if self.class_embedding is not None:
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        x = x + self.position_embedding
        if self.pre_norm[0] is not None:
            x = F.layer_norm(x, (vision.hidden_size,), *self.pre_norm, vision.layer_norm_eps)
        for layer in self.layers:
            x = layer(x)
        if vision.feature_select == "default":
            x = x[:, 1:]
        (w1, b1), (w2, b2) = self.projector
        return F.linear(self.projector_act(F.linear(x, w1, b1)), w2, b2)
