"""Gemma 2 and Gemma 3 decoders: scaled embeddings, (1 + weight) RMSNorms around both sublayers (sandwich
norms), GeGLU, soft-capped attention scores and logits (Gemma 2), alternating sliding and global layers,
and for Gemma 3 per-head q/k norms and a separate rope base for the sliding layers."""

import torch

from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.image_rows import ImageRows
from spyglass.core.models.layers import GatedMLP, SelfAttention
from spyglass.core.models.linear import make_linear
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import lookup_rows
from spyglass.core.models.rope import RotaryEmbedding
from spyglass.kernels.backend import AttentionBackend

_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


class GemmaLayer:
    """One layer's weights; every norm weight already has Gemma's + 1 folded in."""

    __slots__ = (
        "attention",
        "input_norm",
        "mlp",
        "post_attention_norm",
        "post_mlp_norm",
        "pre_mlp_norm",
    )

    def __init__(self, weights, arch: ModelArchConfig, layer: int):
        prefix = f"model.layers.{layer}"
        self.input_norm, self.post_attention_norm, self.pre_mlp_norm, self.post_mlp_norm = (
            weights[f"{prefix}.{name}.weight"] + 1.0 for name in _NORMS
        )
        self.attention = SelfAttention(weights, prefix, arch, layer, norm_offset=1.0)
        self.mlp = GatedMLP(weights, f"{prefix}.mlp", arch.hidden_act)


def weight_names(arch: ModelArchConfig) -> set[str]:
    """The HF parameter names a Gemma 2 or 3 checkpoint holds."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not arch.tie_word_embeddings:
        names.add("lm_head.weight")
    per_layer = [
        *(f"{name}.weight" for name in _NORMS),
        *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
        *(f"self_attn.{p}_proj.bias" for p in "qkv" if arch.attention_bias),
        *(f"self_attn.{p}_norm.weight" for p in "qk" if arch.qk_norm),
        *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
    ]
    return names | {
        f"model.layers.{i}.{n}" for i in range(arch.num_hidden_layers) for n in per_layer
    }


class GemmaForCausalLM:
    """Gemma 2 / Gemma 3 (text) over the flattened, paged batch; same interface as `LlamaForCausalLM`."""

    def __init__(
        self,
        arch: ModelArchConfig,
        weights: dict[str, torch.Tensor],
        backend: AttentionBackend,
        device,
    ):
        self.arch = arch
        self.backend = backend
        w = {name: t.to(device) for name, t in weights.items()}
        self.embed = w["model.embed_tokens.weight"]
        self.final_norm = w["model.norm.weight"] + 1.0
        # transformers rounds the scale to the weights' dtype before multiplying.
        self.embed_scale = torch.tensor(arch.hidden_size**0.5, dtype=self.dtype).item()
        dtype, positions = self.dtype, arch.max_position_embeddings
        self.global_rope = RotaryEmbedding(
            arch.head_dim, positions, arch.rope_theta, arch.rope_scaling, dtype, device
        )
        self.local_rope = self.global_rope
        if arch.local_rope_theta is not None:
            self.local_rope = RotaryEmbedding(
                arch.head_dim, positions, arch.local_rope_theta, None, dtype, device
            )
        self.layers = [GemmaLayer(w, arch, i) for i in range(arch.num_hidden_layers)]
        self.lm_head = make_linear(self.embed if arch.tie_word_embeddings else w["lm_head.weight"])

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the float weights', which the norms always are)."""
        return self.final_norm.dtype

    def forward(
        self,
        input_ids,
        positions,
        meta: AttentionMetadata,
        kv_caches,
        logits_indices,
        image_rows: ImageRows | None = None,
    ) -> torch.Tensor:
        """Float32 logits ``[len(logits_indices), vocab]`` for the chosen rows of the flattened
        batch (``image_rows``: see `hidden_states`)."""
        hidden, residual = self.hidden_states(input_ids, positions, meta, kv_caches, image_rows)
        return self.logits(hidden, residual, logits_indices)

    def hidden_states(
        self,
        input_ids,
        positions,
        meta: AttentionMetadata,
        kv_caches,
        image_rows: ImageRows | None = None,
    ):
        """The last layer's output and the residual stream it adds to, for every token, before
        the final norm. ``image_rows`` (Gemma 3's images) replace their rows' scaled embeddings."""
        eps, ops = self.arch.rms_norm_eps, self.backend
        hidden, residual = lookup_rows(self.embed, input_ids, self.dtype) * self.embed_scale, None
        if image_rows is not None:
            hidden[image_rows.rows] = image_rows.embeds
        local, rotary = self.local_rope.at(positions), self.global_rope.at(positions)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x, residual = ops.add_rms_norm(hidden, residual, layer.input_norm, eps)
            tables = local if self.arch.window(i) else rotary
            hidden = layer.attention(x, tables, meta, k_cache, v_cache, ops)
            hidden, _ = ops.add_rms_norm(hidden, None, layer.post_attention_norm, eps)
            x, residual = ops.add_rms_norm(hidden, residual, layer.pre_mlp_norm, eps)
            hidden, _ = ops.add_rms_norm(layer.mlp(x, ops), None, layer.post_mlp_norm, eps)
        return hidden, residual

    def logits(self, hidden, residual, rows) -> torch.Tensor:
        """Float32 logits of ``rows`` of `hidden_states`' result: the final norm, the head, the soft-cap."""
        logits = self.lm_head(self.final_hidden(hidden, residual, rows)).float()
        cap = self.arch.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def final_hidden(self, hidden, residual, rows) -> torch.Tensor:
        """The final norm's output for ``rows`` (the activations' dtype): what the head reads, and
        a token's embedding (HF's ``last_hidden_state``)."""
        normed, _ = self.backend.add_rms_norm(
            hidden[rows], residual[rows], self.final_norm, self.arch.rms_norm_eps
        )
        return normed
