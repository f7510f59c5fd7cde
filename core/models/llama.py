"""Llama-family decoder (Llama, Qwen2) over a flattened batch of new tokens with a paged KV cache."""

import torch

from spyglass.core.model_config import ModelArchConfig
from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.linear import make_linear
from spyglass.core.models.rope import RotaryEmbedding
from spyglass.core.quantization import cat_rows, lookup_rows
from spyglass.kernels.backend import AttentionBackend


class LlamaLayerWeights:
    """One decoder layer's weights, with q/k/v and gate/up fused so each is a single matmul."""

    __slots__ = ("input_norm", "qkv", "o_proj", "post_norm", "gate_up", "down")

    def __init__(self, weights: dict[str, torch.Tensor], prefix: str, bias: bool):
        attn = f"{prefix}.self_attn"
        self.input_norm = weights[f"{prefix}.input_layernorm.weight"]
        qkv_bias = torch.cat([weights[f"{attn}.{p}_proj.bias"] for p in "qkv"]) if bias else None
        self.qkv = make_linear(cat_rows([weights[f"{attn}.{p}_proj.weight"] for p in "qkv"]), qkv_bias)
        self.o_proj = make_linear(weights[f"{attn}.o_proj.weight"])
        self.post_norm = weights[f"{prefix}.post_attention_layernorm.weight"]
        mlp = f"{prefix}.mlp"
        self.gate_up = make_linear(cat_rows([weights[f"{mlp}.gate_proj.weight"], weights[f"{mlp}.up_proj.weight"]]))
        self.down = make_linear(weights[f"{mlp}.down_proj.weight"])


class LlamaForCausalLM:
    """A plain-tensor Llama: no nn.Module, so each step is a short, flat sequence of torch ops."""

    def __init__(self, arch: ModelArchConfig, weights: dict[str, torch.Tensor], backend: AttentionBackend, device):
        self.arch = arch
        self.backend = backend
        w = {name: t.to(device) for name, t in weights.items()}
        self.embed = w["model.embed_tokens.weight"]
        self.layers = [
            LlamaLayerWeights(w, f"model.layers.{i}", arch.attention_bias) for i in range(arch.num_hidden_layers)
        ]
        self.final_norm = w["model.norm.weight"]
        self.lm_head = make_linear(self.embed if arch.tie_word_embeddings else w["lm_head.weight"])
        self.rope = RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.rope_theta, arch.rope_scaling, self.dtype, device
        )
        self.scale = arch.head_dim**-0.5
        self.q_size = arch.num_attention_heads * arch.head_dim
        self.kv_size = arch.num_key_value_heads * arch.head_dim

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (the float weights', which the norms always are)."""
        return self.final_norm.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits ``[len(logits_indices), vocab]`` for the chosen rows of the flattened batch."""
        hidden, residual = self.hidden_states(input_ids, positions, meta, kv_caches)
        normed, _ = self.backend.add_rms_norm(
            hidden[logits_indices], residual[logits_indices], self.final_norm, self.arch.rms_norm_eps
        )
        return self.lm_head(normed).float()

    def hidden_states(self, input_ids, positions, meta: AttentionMetadata, kv_caches):
        """The last layer's output and the residual stream it adds to, for every token, before the final norm."""
        eps, ops = self.arch.rms_norm_eps, self.backend
        hidden, residual = lookup_rows(self.embed, input_ids, self.dtype), None
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x, residual = ops.add_rms_norm(hidden, residual, layer.input_norm, eps)
            hidden = self._attention(layer, x, positions, meta, k_cache, v_cache)
            x, residual = ops.add_rms_norm(hidden, residual, layer.post_norm, eps)
            hidden = layer.down(ops.silu_and_mul(layer.gate_up(x)))
        return hidden, residual

    def _attention(self, layer, x, positions, meta: AttentionMetadata, k_cache, v_cache) -> torch.Tensor:
        num_tokens, head_dim = x.shape[0], self.arch.head_dim
        qkv = layer.qkv(x)
        # Rotate q and k heads together, in place: one rope call instead of two.
        qk = qkv[:, : self.q_size + self.kv_size].view(num_tokens, -1, head_dim)
        self.backend.rotary_embedding_(qk, positions, self.rope.cos, self.rope.sin)
        q = qk[:, : self.arch.num_attention_heads]
        k = qk[:, self.arch.num_attention_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(num_tokens, -1, head_dim)
        self.backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = self.backend.paged_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.context_lens,
            meta.query_start_loc,
            meta.max_query_len,
            meta.max_context_len,
            self.scale,
        )
        return layer.o_proj(out.reshape(num_tokens, self.q_size))
