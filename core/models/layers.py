"""Decoder pieces the model families share: self-attention over the paged cache, the gated MLP, and a sparse
mixture of experts. Every projection is made by `make_linear`, so other weight formats (GGUF blocks) plug in there."""

import torch

from spyglass.core.models.attention_metadata import AttentionMetadata
from spyglass.core.models.linear import make_linear
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import QuantizedWeight, cat_rows
from spyglass.core.models.rope import RotaryTables
from spyglass.kernels.backend import AttentionBackend
from spyglass.kernels.torch_moe import sort_by_expert

# HF activation name -> the backend op applying it to the gate half of a fused [gate | up] row.
_GATED_ACTIVATIONS = {"silu": "silu_and_mul", "gelu_pytorch_tanh": "gelu_tanh_and_mul"}
# HF activation name -> the `torch_moe.fused_experts` activation.
_EXPERT_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def gated_activation(hidden_act: str) -> str:
    """The backend op name for ``hidden_act``; ValueError for an activation no backend has."""
    if hidden_act not in _GATED_ACTIVATIONS:
        raise ValueError(
            f"unsupported MLP activation {hidden_act!r}; supported: {', '.join(_GATED_ACTIVATIONS)}"
        )
    return _GATED_ACTIVATIONS[hidden_act]


def _fused(weights: dict[str, torch.Tensor], fused: str, parts: list[str]) -> torch.Tensor:
    """``weights[fused]`` where the checkpoint stores it fused (Phi-3), else the parts concatenated."""
    return weights[fused] if fused in weights else cat_rows([weights[name] for name in parts])


class SelfAttention:
    """One layer's attention: fused q/k/v projection, optional per-head q/k RMSNorm (Qwen3, Gemma 3),
    rotary embedding (the step's `RotaryTables`), KV store, paged attention with the layer's window
    and soft-cap, output projection."""

    __slots__ = ("arch", "k_norm", "o_proj", "q_norm", "qkv", "scale", "softcap", "window")

    def __init__(
        self,
        weights,
        prefix: str,
        arch: ModelArchConfig,
        layer: int,
        norm_offset: float = 0.0,
    ):
        attn = f"{prefix}.self_attn"
        names = [f"{attn}.{p}_proj.weight" for p in "qkv"]
        bias = None
        if arch.attention_bias:
            bias = _fused(
                weights, f"{attn}.qkv_proj.bias", [n.replace(".weight", ".bias") for n in names]
            )
        self.qkv = make_linear(_fused(weights, f"{attn}.qkv_proj.weight", names), bias)
        self.o_proj = make_linear(weights[f"{attn}.o_proj.weight"])
        # Gemma's norms scale by (1 + weight): the offset folds that into the weight once.
        self.q_norm = weights[f"{attn}.q_norm.weight"] + norm_offset if arch.qk_norm else None
        self.k_norm = weights[f"{attn}.k_norm.weight"] + norm_offset if arch.qk_norm else None
        self.window = arch.window(layer)
        self.softcap = arch.attn_logit_softcapping
        self.scale = (arch.query_pre_attn_scalar or arch.head_dim) ** -0.5
        self.arch = arch

    def __call__(
        self,
        x,
        rotary: RotaryTables,
        meta: AttentionMetadata,
        k_cache,
        v_cache,
        ops: AttentionBackend,
    ):
        """The attention output ``[num_tokens, hidden]`` of the normed input ``x``, its q and k
        rotated by ``rotary``; stores this step's K and V."""
        arch = self.arch
        num_tokens, num_heads, head_dim = x.shape[0], arch.num_attention_heads, arch.head_dim
        q_size, kv_size = num_heads * head_dim, arch.num_key_value_heads * head_dim
        qkv = self.qkv(x)
        qk = qkv[:, : q_size + kv_size].view(num_tokens, -1, head_dim)
        if self.q_norm is not None:
            self._norm_heads_(qk, ops)
        # Rotate q and k heads together, in place: one rope call instead of two.
        ops.rotary_embedding_(qk, rotary.positions, rotary.cos, rotary.sin)
        v = qkv[:, q_size + kv_size :].view(num_tokens, -1, head_dim)
        ops.store_kv(qk[:, num_heads:], v, k_cache, v_cache, meta.slot_mapping)
        out = ops.paged_attention(
            qk[:, :num_heads],
            k_cache,
            v_cache,
            meta.block_tables,
            meta.context_lens,
            meta.query_start_loc,
            meta.max_query_len,
            meta.max_context_len,
            self.scale,
            sliding_window=self.window,
            softcap=self.softcap,
            visible_ends=meta.visible_ends,
        )
        return self.o_proj(out.reshape(num_tokens, q_size))

    def _norm_heads_(self, qk: torch.Tensor, ops: AttentionBackend) -> None:
        """RMS-normalise each query head and each key head of ``qk [num_tokens, heads, head_dim]`` in place."""
        num_heads, eps = self.arch.num_attention_heads, self.arch.rms_norm_eps
        for heads, weight in ((qk[:, :num_heads], self.q_norm), (qk[:, num_heads:], self.k_norm)):
            normed, _ = ops.add_rms_norm(heads.reshape(-1, heads.shape[-1]), None, weight, eps)
            heads.copy_(normed.view(heads.shape))


class GatedMLP:
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one matmul."""

    __slots__ = ("activation", "down", "gate_up")

    def __init__(
        self,
        weights,
        prefix: str,
        hidden_act: str,
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    ):
        gate, up, down = (f"{prefix}.{name}.weight" for name in names)
        self.gate_up = make_linear(_fused(weights, f"{prefix}.gate_up_proj.weight", [gate, up]))
        self.down = make_linear(weights[down])
        self.activation = gated_activation(hidden_act)

    def __call__(self, x: torch.Tensor, ops: AttentionBackend) -> torch.Tensor:
        """The MLP output for ``x [num_tokens, hidden]``."""
        return self.down(getattr(ops, self.activation)(self.gate_up(x)))


class SparseMoE:
    """Top-k routed experts (softmax over the router's logits, optionally renormalised over the chosen k),
    plus a sigmoid-gated shared expert where the family has one (Qwen2-MoE).

    Float expert weights are stacked once (``w13 [experts, 2 * inter, hidden]`` gate then up rows,
    ``w2 [experts, hidden, inter]``) and every expert runs in one grouped backend call
    (`torch_moe.fused_experts` is the contract). Experts kept in quantized blocks stay per-expert
    `GatedMLP`s, run one matmul chain per active expert (`looped`).
    """

    __slots__ = (
        "activation",
        "experts",
        "renormalize",
        "router",
        "shared",
        "shared_gate",
        "top_k",
        "w2",
        "w13",
    )

    def __init__(self, weights, prefix: str, arch: ModelArchConfig, names: tuple[str, str, str]):
        self.router = make_linear(weights[f"{prefix}.gate.weight"])
        experts = [f"{prefix}.experts.{e}" for e in range(arch.num_experts)]
        gate, up, down = names
        if any(
            isinstance(w, QuantizedWeight)
            for name, w in weights.items()
            if name.startswith(f"{prefix}.experts.")
        ):
            self.experts = [GatedMLP(weights, e, arch.hidden_act, names) for e in experts]
            self.w13 = self.w2 = None
        else:
            self.experts = None
            self.w13 = torch.stack(
                [
                    _fused(
                        weights,
                        f"{e}.gate_up_proj.weight",
                        [f"{e}.{gate}.weight", f"{e}.{up}.weight"],
                    )
                    for e in experts
                ]
            )
            self.w2 = torch.stack([weights[f"{e}.{down}.weight"] for e in experts])
        gated_activation(arch.hidden_act)
        self.activation = _EXPERT_ACTIVATIONS[arch.hidden_act]
        has_shared = arch.shared_expert_intermediate_size > 0
        self.shared = (
            GatedMLP(weights, f"{prefix}.shared_expert", arch.hidden_act) if has_shared else None
        )
        self.shared_gate = (
            make_linear(weights[f"{prefix}.shared_expert_gate.weight"]) if has_shared else None
        )
        self.top_k = arch.num_experts_per_tok
        self.renormalize = arch.norm_topk_prob

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights, experts)``, both ``[num_tokens, top_k]``: each token's chosen experts and their weights."""
        probs = self.router(x).float().softmax(dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.renormalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def __call__(self, x: torch.Tensor, ops: AttentionBackend) -> torch.Tensor:
        """The weighted sum of each token's experts (and the shared expert) for ``x [num_tokens, hidden]``."""
        weights, chosen = self.route(x)
        if self.experts is None:
            out = ops.fused_experts(x, self.w13, self.w2, weights, chosen, self.activation)
        else:
            out = self.looped(x, weights, chosen, ops)
        if self.shared is not None:
            out += torch.sigmoid(self.shared_gate(x)) * self.shared(x, ops)
        return out

    def looped(self, x, weights, chosen, ops: AttentionBackend) -> torch.Tensor:
        """The routed experts' sum for per-expert (quantized) weights: one matmul chain per active expert."""
        sorted_pairs, counts = sort_by_expert(chosen, len(self.experts))
        weights = weights.flatten()
        out = torch.zeros_like(x)
        start = 0
        for expert, count in zip(self.experts, counts.tolist()):
            if count:
                pairs = sorted_pairs[start : start + count]
                tokens = pairs // self.top_k
                out.index_add_(0, tokens, expert(x[tokens], ops) * weights[pairs, None])
                start += count
        return out
