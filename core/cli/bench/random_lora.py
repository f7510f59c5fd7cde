"""Random LoRA adapters in PEFT's format for a model's shapes: what ``bench throughput --compare-lora``
runs with when no real adapter is at hand (the cost of a delta does not depend on its values)."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from spyglass.core.models.model_config import ModelArchConfig


def _projections(arch: ModelArchConfig, layer: int) -> dict[str, tuple[int, int]]:
    """The (in, out) widths of the layer's projections PEFT would name, by module path."""
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    hidden, inter = arch.hidden_size, arch.intermediate_size
    shapes = {
        "self_attn.q_proj": (hidden, q),
        "self_attn.k_proj": (hidden, kv),
        "self_attn.v_proj": (hidden, kv),
        "self_attn.o_proj": (q, hidden),
    }
    if layer not in arch.moe_layers:
        shapes |= {
            "mlp.gate_proj": (hidden, inter),
            "mlp.up_proj": (hidden, inter),
            "mlp.down_proj": (inter, hidden),
        }
    return shapes


def write_random_lora(path: Path, arch: ModelArchConfig, rank: int, seed: int) -> Path:
    """A rank-``rank`` adapter on every attention and dense-MLP projection of ``arch``, at ``path``."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(arch.num_hidden_layers):
        for module, (width_in, width_out) in _projections(arch, layer).items():
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, width_in, generator=generator) / 50
            tensors[f"{key}.lora_B.weight"] = torch.randn(width_out, rank, generator=generator) / 50
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path / "adapter_model.safetensors")
    targets = sorted({module.split(".")[1] for module in _projections(arch, 0)})
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets}
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path
