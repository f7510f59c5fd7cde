"""Read a PEFT LoRA adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``)
into a `LoRAAdapter` laid out for the model's fused projections.

PEFT names each pair by the HF module it changes (``...layers.3.self_attn.q_proj.lora_A.weight``,
``[rank, in]``; ``lora_B.weight``, ``[out, rank]``). q, k and v (and gate and up) run as one fused
matmul here, so their pairs become one: the ``a`` matrices stacked, and a ``b`` that puts each
part's output in its own rows (zeros where the part has no delta). The scale is
``lora_alpha / rank`` (``/ sqrt(rank)`` with ``use_rslora``), per module where ``rank_pattern`` or
``alpha_pattern`` say so, and is folded into ``b``. What the model could not run exactly is refused
with the reason: DoRA, trained biases, ``modules_to_save``, embedding or head deltas, experts.
"""

import json
import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from spyglass.core.models.lora import LoRAAdapter, LoRAPair
from spyglass.core.models.model_config import ModelArchConfig

# The module may be nested (``mlp.experts``, ``mlp.shared_expert.gate_proj``): such a key is
# refused with its reason below rather than as unknown.
_KEY = re.compile(
    r"(?:base_model\.model\.)?model\.layers\.(\d+)\.(self_attn|mlp)\.([\w.]+)\.lora_([AB])\.weight"
)
# HF module name -> (the fused projection it belongs to, its part's index in that projection).
_PARTS = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "qkv_proj": ("qkv", None),
    "o_proj": ("o_proj", None),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "gate_up_proj": ("gate_up", None),
    "down_proj": ("down", None),
}


def read_adapter_config(path: Path) -> dict:
    """The adapter's ``adapter_config.json``; ValueError for what cannot be served exactly."""
    config_file = path / "adapter_config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
    config = json.loads(config_file.read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    refused = {
        "use_dora": "DoRA adapters are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D) adapters are not supported",
        "modules_to_save": "modules_to_save (fully trained modules) are not supported",
        "layers_to_transform": "layers_to_transform is not supported",
    }
    for key, reason in refused.items():
        if config.get(key):
            raise ValueError(f"{path}: {reason}")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{path}: trained biases (bias={config['bias']!r}) are not supported")
    return config


def _pattern_value(patterns: dict, module: str, default):
    """PEFT's rank/alpha pattern lookup: the first key (a regex) that names ``module`` or a suffix
    of it. The key is grouped, as PEFT groups it, so that an alternation spans the whole key."""
    for key, value in (patterns or {}).items():
        if re.fullmatch(rf"(.*\.)?(?:{key})", module):
            return value
    return default


def load_lora_adapter(
    path: str | Path,
    name: str,
    arch: ModelArchConfig,
    max_rank: int,
    dtype: torch.dtype,
    device: torch.device,
) -> LoRAAdapter:
    """The adapter at ``path`` for a model of ``arch``; ValueError naming what does not fit."""
    path = Path(path)
    config = read_adapter_config(path)
    weights_file = path / "adapter_model.safetensors"
    if not weights_file.is_file():
        raise ValueError(
            f"{path} has no adapter_model.safetensors (PyTorch .bin adapters are not supported)"
        )
    modules: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(weights_file).items():
        match = _KEY.fullmatch(key)
        if match is None:
            raise ValueError(f"{path}: cannot apply {key!r} (only attention and MLP projections)")
        layer, block, module, half = int(match[1]), match[2], match[3], match[4]
        if block == "mlp" and layer in arch.moe_layers:
            raise ValueError(f"{path}: {key!r} targets a mixture-of-experts layer's MLP")
        if module not in _PARTS or layer >= arch.num_hidden_layers:
            raise ValueError(f"{path}: cannot apply {key!r} to this model")
        modules.setdefault((layer, block, module), {})[half] = tensor
    if not modules:
        raise ValueError(f"{path}: the adapter has no LoRA weights")
    rank = max(t["A"].shape[0] for t in modules.values() if "A" in t)
    if rank > max_rank:
        raise ValueError(f"{path}: rank {rank} is over --max-lora-rank {max_rank}")
    parts: dict[tuple[int, str], dict[int | None, tuple[torch.Tensor, torch.Tensor]]] = {}
    for (layer, block, module), halves in modules.items():
        if set(halves) != {"A", "B"}:
            raise ValueError(f"{path}: layer {layer} {module} lacks lora_A or lora_B")
        a, b = halves["A"], halves["B"]
        full_name = f"model.layers.{layer}.{block}.{module}"
        module_rank = a.shape[0]
        # PEFT's default alpha is 8.
        default_alpha = config.get("lora_alpha", 8)
        alpha = _pattern_value(config.get("alpha_pattern"), full_name, default_alpha)
        scale = alpha / (math.sqrt(module_rank) if config.get("use_rslora") else module_rank)
        projection, part = _PARTS[module]
        parts.setdefault((layer, projection), {})[part] = (a.float(), b.float() * scale)
    sizes = _part_sizes(arch)
    pairs = {
        key: _fused_pair(path, key, found, sizes[key[1]], dtype, device)
        for key, found in parts.items()
    }
    num_parameters = sum(t.numel() for halves in modules.values() for t in halves.values())
    return LoRAAdapter(name, rank, str(path), pairs, num_parameters)


def _part_sizes(arch: ModelArchConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Per fused projection: its input width and its parts' output widths."""
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_key_value_heads * arch.head_dim
    inter = arch.intermediate_size
    return {
        "qkv": (arch.hidden_size, (q, kv, kv)),
        "o_proj": (q, (arch.hidden_size,)),
        "gate_up": (arch.hidden_size, (inter, inter)),
        "down": (inter, (arch.hidden_size,)),
    }


def _fused_pair(
    path: Path,
    key: tuple[int, str],
    found: dict[int | None, tuple[torch.Tensor, torch.Tensor]],
    sizes: tuple[int, tuple[int, ...]],
    dtype: torch.dtype,
    device: torch.device,
) -> LoRAPair:
    """One pair for the fused projection ``key`` from its parts' pairs (a part of None: the whole)."""
    width, outs = sizes
    if None in found:  # the checkpoint's own fused module (Phi-3's qkv_proj, gate_up_proj)
        found = {0: found[None]}
        outs = (sum(outs),)
    offsets = [sum(outs[:i]) for i in range(len(outs))]
    rank = sum(a.shape[0] for a, _ in found.values())
    b_full = torch.zeros(sum(outs), rank)
    column = 0
    for part in sorted(found):
        a, b = found[part]
        if a.shape[1] != width or b.shape != (outs[part], a.shape[0]):
            raise ValueError(
                f"{path}: layer {key[0]} {key[1]} has shapes {tuple(a.shape)} and "
                f"{tuple(b.shape)}, which do not fit this model"
            )
        b_full[offsets[part] : offsets[part] + outs[part], column : column + a.shape[0]] = b
        column += a.shape[0]
    a_full = torch.cat([found[part][0] for part in sorted(found)])
    return LoRAPair(a=a_full.to(device, dtype), b=b_full.to(device, dtype))
