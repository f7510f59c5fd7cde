"""The Llama-style decoder over a flattened batch of new tokens with a paged KV cache.

One definition serves every family whose layer is ``x + attn(norm(x))`` then ``x + mlp(norm(x))``:
Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norm), Mistral (sliding window), Phi-3 (fused projections in
the checkpoint, LongRoPE), and the mixture-of-experts Mixtral, Qwen2-MoE and Qwen3-MoE.
"""

import torch

from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.image_rows import ImageRows
from spyglass.core.models.layers import GatedMLP, SelfAttention, SparseMoE
from spyglass.core.models.linear import make_linear
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.mrope import rotary_embedding
from spyglass.core.models.quantization import lookup_rows
from spyglass.kernels.backend import AttentionBackend

# Where a family keeps its experts, and their gate, up and down projections' names.
_EXPERTS = {"mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
_QWEN_EXPERTS = ("mlp", ("gate_proj", "up_proj", "down_proj"))


class LlamaLayer:
    """One pre-norm decoder layer's weights: attention and a dense or sparse MLP."""

    __slots__ = ("attention", "input_norm", "mlp", "post_norm")

    def __init__(self, weights, arch: ModelArchConfig, layer: int):
        prefix = f"model.layers.{layer}"
        self.input_norm = weights[f"{prefix}.input_layernorm.weight"]
        self.attention = SelfAttention(weights, prefix, arch, layer)
        self.post_norm = weights[f"{prefix}.post_attention_layernorm.weight"]
        if layer in arch.moe_layers:
            module, names = _EXPERTS.get(arch.architecture, _QWEN_EXPERTS)
            self.mlp = SparseMoE(weights, f"{prefix}.{module}", arch, names)
        else:
            self.mlp = GatedMLP(weights, f"{prefix}.mlp", arch.hidden_act)


def weight_names(arch: ModelArchConfig, fused_projections: bool = False) -> set[str]:
    """The HF parameter names a checkpoint of this architecture holds (``fused_projections``: Phi-3's
    ``qkv_proj`` and ``gate_up_proj``)."""
    attention = ["qkv"] if fused_projections else list("qkv")
    mlp = ["gate_up", "down"] if fused_projections else ["gate", "up", "down"]
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if arch.has_lm_head and not arch.tie_word_embeddings:
        names.add("lm_head.weight")
    if arch.num_labels:
        names.add("score.weight")
    for i in range(arch.num_hidden_layers):
        prefix = f"model.layers.{i}"
        names |= {f"{prefix}.input_layernorm.weight", f"{prefix}.post_attention_layernorm.weight"}
        names |= {f"{prefix}.self_attn.{p}_proj.weight" for p in [*attention, "o"]}
        if arch.attention_bias:
            names |= {f"{prefix}.self_attn.{p}_proj.bias" for p in attention}
        if arch.qk_norm:
            names |= {f"{prefix}.self_attn.q_norm.weight", f"{prefix}.self_attn.k_norm.weight"}
        if i not in arch.moe_layers:
            names |= {f"{prefix}.mlp.{p}_proj.weight" for p in mlp}
            continue
        module, expert_names = _EXPERTS.get(arch.architecture, _QWEN_EXPERTS)
        names.add(f"{prefix}.{module}.gate.weight")
        names |= {
            f"{prefix}.{module}.experts.{e}.{p}.weight"
            for e in range(arch.num_experts)
            for p in expert_names
        }
        if arch.shared_expert_intermediate_size:
            names |= {
                f"{prefix}.{module}.shared_expert.{p}_proj.weight" for p in ("gate", "up", "down")
            }
            names.add(f"{prefix}.{module}.shared_expert_gate.weight")
    return names


class LlamaForCausalLM:
    """A plain-tensor decoder: no nn.Module, so each step is a short, flat sequence of torch ops."""

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
        self.final_norm = w["model.norm.weight"]
        self.rope = rotary_embedding(
            arch.head_dim,
            arch.max_position_embeddings,
            arch.rope_theta,
            arch.rope_scaling,
            self.dtype,
            device,
        )
        self.layers = [LlamaLayer(w, arch, i) for i in range(arch.num_hidden_layers)]
        self.lm_head = None  # a base model or a classifier has none
        if arch.has_lm_head:
            head = self.embed if arch.tie_word_embeddings else w["lm_head.weight"]
            self.lm_head = make_linear(head)
        # A sequence classifier's head: class logits from the last token's final hidden state.
        self.score = make_linear(w["score.weight"]) if arch.num_labels else None

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
        image_rows: ImageRows | None = None,
    ) -> torch.Tensor:
        """Float32 logits ``[len(logits_indices), vocab]`` for the chosen rows of the flattened
        batch (``image_rows``: see `hidden_states`)."""
        hidden, residual = self.hidden_states(input_ids, positions, meta, kv_caches, image_rows)
        return self.logits(hidden, residual, logits_indices)

    def logits(
        self, hidden: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor | slice
    ) -> torch.Tensor:
        """Float32 logits of ``rows`` of `hidden_states`' result: the final norm, then the head."""
        return self.lm_head(self.final_hidden(hidden, residual, rows)).float()

    def final_hidden(
        self, hidden: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor | slice
    ) -> torch.Tensor:
        """The final norm's output for ``rows`` of `hidden_states`' result, in the activations'
        dtype: what the head reads, and a token's embedding (HF's ``last_hidden_state``)."""
        normed, _ = self.backend.add_rms_norm(
            hidden[rows], residual[rows], self.final_norm, self.arch.rms_norm_eps
        )
        return normed

    def classify(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """Float32 class logits ``[rows, num_labels]`` of `final_hidden` rows (a classifier only)."""
        return self.score(final_hidden.to(self.dtype)).float()

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings of ``input_ids`` in the activations' dtype (a tensor-parallel rank sums its share)."""
        return lookup_rows(self.embed, input_ids, self.dtype)

    def hidden_states(
        self,
        input_ids,
        positions,
        meta: AttentionMetadata,
        kv_caches,
        image_rows: ImageRows | None = None,
    ):
        """The last layer's output and the residual stream it adds to, for every token, before
        the final norm. ``image_rows`` (a vision model's prompt) replace their rows' embeddings;
        where an image's embeddings are wider than the model (Qwen3-VL's DeepStack), the rest,
        a hidden size each, are added to those rows after the first layers, one a layer.
        ``positions`` are the tokens' ``[tokens]``, or M-RoPE's ``[3, tokens]`` (`mrope`)."""
        eps, ops = self.arch.rms_norm_eps, self.backend
        hidden, residual = self.embed_tokens(input_ids), None
        rotary = self.rope.at(positions)
        deepstack = ()
        if image_rows is not None:
            first, *deepstack = image_rows.embeds.split(self.arch.hidden_size, dim=-1)
            hidden[image_rows.rows] = first
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x, residual = ops.add_rms_norm(hidden, residual, layer.input_norm, eps)
            hidden = layer.attention(x, rotary, meta, k_cache, v_cache, ops)
            x, residual = ops.add_rms_norm(hidden, residual, layer.post_norm, eps)
            hidden = layer.mlp(x, ops)
            if i < len(deepstack):
                hidden[image_rows.rows] += deepstack[i]
        return hidden, residual
