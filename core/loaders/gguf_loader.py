"""Load a GGUF file (llama, qwen2, qwen3, qwen2moe, qwen3moe, phi3, gemma2, gemma3) into a Checkpoint."""

import logging
import re
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from tqdm import tqdm

from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.gguf_config import gguf_architecture, read_arch
from spyglass.core.loaders.gguf_tokenizer import read_tokenizer
from spyglass.core.loaders.gguf_transcode import target_type, transcode
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import QuantizedWeight, from_gguf

log = logging.getLogger(__name__)

# llama.cpp tensor name suffix -> HF name suffix, inside ``blk.{i}.`` / ``model.layers.{i}.``.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
# Where the architectures' HF names differ from the table above. Gemma has four norms per layer;
# Phi-3 stores q/k/v as one matrix and gate/up as one (gate rows first), as HF does.
_ARCH_LAYER_NAMES = {
    "gemma2": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    "mixtral": {"ffn_gate_inp": "block_sparse_moe.gate"},
}
_ARCH_LAYER_NAMES["gemma3"] = _ARCH_LAYER_NAMES["gemma2"]
# Every expert's projection in one 3-D tensor (or, in older Mixtral files, one tensor per expert:
# ``blk.N.ffn_gate.E``), split into HF's per-expert names on load.
_EXPERT_STACKS = {"ffn_gate_exps": "gate", "ffn_up_exps": "up", "ffn_down_exps": "down"}
_EXPERT_NAMES = {
    "mixtral": "block_sparse_moe.experts.{}.w{}",
    None: "mlp.experts.{}.{}_proj",
}
_MIXTRAL_W = {"gate": 1, "down": 2, "up": 3}
_PER_EXPERT_TENSOR = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")
# Metadata stored as tensors (read by gguf_config).
_NOT_WEIGHTS = {"rope_factors_long.weight", "rope_factors_short.weight"}
# llama.cpp's Gemma converters store RMSNorm weights with Gemma's "1 +" added; HF's names hold w.
_NORM_SHIFTED = {"gemma2", "gemma3"}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(path: str | Path, dtype: torch.dtype, keep_quantized: bool = False) -> Checkpoint:
    """Load a GGUF file of an architecture `gguf_config` reads, dequantizing every tensor to ``dtype``.

    Weights come out under HF names and layouts, equal to what ``transformers`` produces when
    loading the same file with ``gguf_file=``. With ``keep_quantized``, matrices in a block type the
    CPU kernels multiply (`cpu_quant.SUPPORTED_TYPES`) stay in their blocks as `QuantizedWeight`,
    and matrices of other quantized types are rewritten into such blocks (`gguf_transcode`).
    """
    path = Path(path)
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"Cannot read {path} as a GGUF file: {exc}") from exc
    arch = read_arch(reader)
    weights = _read_weights(reader, gguf_architecture(reader), arch, dtype, keep_quantized)
    return Checkpoint(path.stem, arch, weights, read_tokenizer(reader, arch.eos_token_ids))


def _expert_name(architecture: str, layer: str, proj: str, expert: str) -> str:
    pattern = _EXPERT_NAMES.get(architecture, _EXPERT_NAMES[None])
    return f"model.layers.{layer}." + pattern.format(
        expert, _MIXTRAL_W[proj] if architecture == "mixtral" else proj
    )


def _hf_name(gguf_name: str, architecture: str) -> str | None:
    """HF's name for a GGUF tensor; ``{}`` stands for the expert index of a 3-D expert stack."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    per_expert = _PER_EXPERT_TENSOR.fullmatch(gguf_name)
    if per_expert is not None:
        return _expert_name(architecture, per_expert[1], per_expert[2], per_expert[3]) + ".weight"
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is not None and match[2] in _EXPERT_STACKS:
        return _expert_name(architecture, match[1], _EXPERT_STACKS[match[2]], "{}") + f".{match[3]}"
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(architecture, {})}
    if match is None or match[2] not in names:
        return None
    return f"model.layers.{match[1]}.{names[match[2]]}.{match[3]}"


def _unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    # convert_hf_to_gguf reorders each head's q/k rows from HF's rotate-half layout (all first halves,
    # then all second halves) to llama.cpp's interleaved pairs: row (h, half, i) -> (h, i, half).
    # This is the inverse; it applies to biases too (1-D), which the converter permutes the same way.
    return (
        w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _read_weights(
    reader: GGUFReader,
    gguf_arch: str,
    arch: ModelArchConfig,
    dtype: torch.dtype,
    keep_quantized: bool,
) -> dict[str, torch.Tensor | QuantizedWeight]:
    weights = {}
    rewritten: Counter[str] = Counter()  # "Q6_K as Q8_0" -> matrices
    # A progress bar on a terminal only (the conversion runs once per model; later starts use the cache).
    for tensor in tqdm(reader.tensors, desc="converting weights", unit="tensor", disable=None):
        if tensor.name in _NOT_WEIGHTS:
            continue
        name = _hf_name(tensor.name, arch.architecture)
        if name is None:
            raise ValueError(
                f"Unexpected tensor {tensor.name!r} in GGUF file; it is not a {arch.architecture} tensor."
            )
        # Blocks run along a row, so whole rows of blocks permute like rows of values.
        values, qtype = _kept_blocks(tensor) if keep_quantized else (None, None)
        keep = values is not None
        if keep and qtype != tensor.tensor_type:
            rewritten[f"{tensor.tensor_type.name} as {qtype.name}"] += 1
        if not keep:
            values = dequantize(tensor.data, tensor.tensor_type)
        # Only llama.cpp's llama converter (Llama, Mistral, Mixtral) interleaves the rotary halves of q and k.
        if gguf_arch == "llama" and ".q_proj." in name:
            values = _unpermute_rotary_rows(values, arch.num_attention_heads)
        elif gguf_arch == "llama" and ".k_proj." in name:
            values = _unpermute_rotary_rows(values, arch.num_key_value_heads)
        elif gguf_arch in _NORM_SHIFTED and name.endswith("norm.weight"):
            values = values - 1.0  # dequantized norms are float32 arrays
        elif name.endswith("shared_expert_gate.weight"):
            values = values.reshape(1, -1)  # llama.cpp stores the [1, hidden] gate as a vector
        # Copy: the reader memory-maps the file, and the result must outlive it and be writable.
        if "{}" in name:
            for e, expert in enumerate(values):
                weights[name.format(e)] = torch.from_numpy(np.array(expert)).to(dtype)
        elif keep:
            weights[name] = from_gguf(values, qtype)
        else:
            weights[name] = torch.from_numpy(np.array(values)).to(dtype)
    if rewritten:
        log.info(
            "GGUF blocks the CPU kernels do not multiply, rewritten: %s",
            ", ".join(f"{kind} ({count} matrices)" for kind, count in sorted(rewritten.items())),
        )
    return weights


def _kept_blocks(tensor) -> tuple[np.ndarray | None, GGMLQuantizationType | None]:
    """A matrix's blocks in a type the CPU kernels multiply, or (None, None) where it must be dequantized."""
    target = target_type(tensor.tensor_type)
    if tensor.data.ndim != 2 or target is None:
        return None, None
    if target == tensor.tensor_type:
        return tensor.data, target
    return transcode(tensor.data, tensor.tensor_type) or (None, None)
