"""Load a GGUF file (llama, qwen2, qwen3, qwen2moe, qwen3moe) into a Checkpoint: config, weights, tokenizer."""

import logging
import re
from functools import cache
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader, TokenType
from gguf.quants import dequantize
from tqdm import tqdm
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.gguf_config import field as _field
from spyglass.core.loaders.gguf_config import read_arch
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.quantization import QuantizedWeight, from_gguf
from spyglass.core.tokenizer import Tokenizer
from spyglass.kernels.cpu_quant import SUPPORTED_TYPES

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
# Every expert's projection in one 3-D tensor, split into HF's per-expert names on load.
_EXPERT_STACKS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")

# Split regexes for ``tokenizer.ggml.pre`` values whose vocabulary was not trained on GPT-2's split
# (same table as llama.cpp / transformers). Anything else falls back to GPT-2's byte-level regex.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZER_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_GPT2_PRE_TOKENIZERS = {None, "default", "gpt-2", "gpt2"}


def load_gguf(path: str | Path, dtype: torch.dtype, keep_quantized: bool = False) -> Checkpoint:
    """Load a GGUF file of an architecture `gguf_config` reads, dequantizing every tensor to ``dtype``.

    Weights come out under HF names and layouts, equal to what ``transformers`` produces when
    loading the same file with ``gguf_file=``. With ``keep_quantized``, matrices in a block type the
    CPU kernels multiply (`cpu_quant.SUPPORTED_TYPES`) stay in their blocks as `QuantizedWeight`.
    """
    path = Path(path)
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"Cannot read {path} as a GGUF file: {exc}") from exc
    arch = read_arch(reader)
    weights = _read_weights(reader, arch, dtype, keep_quantized)
    return Checkpoint(path.stem, arch, weights, _read_tokenizer(reader, arch.eos_token_ids))


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is not None and match[2] in _EXPERT_STACKS:
        return f"model.layers.{match[1]}.mlp.experts.{{}}.{_EXPERT_STACKS[match[2]]}.{match[3]}"
    if match is None or match[2] not in _LAYER_NAMES:
        return None
    return f"model.layers.{match[1]}.{_LAYER_NAMES[match[2]]}.{match[3]}"


def _unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    # convert_hf_to_gguf reorders each head's q/k rows from HF's rotate-half layout (all first halves,
    # then all second halves) to llama.cpp's interleaved pairs: row (h, half, i) -> (h, i, half).
    # This is the inverse; it applies to biases too (1-D), which the converter permutes the same way.
    return w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_weights(
    reader: GGUFReader, arch: ModelArchConfig, dtype: torch.dtype, keep_quantized: bool
) -> dict[str, torch.Tensor | QuantizedWeight]:
    weights = {}
    # A progress bar on a terminal only (the conversion runs once per model; later starts use the cache).
    for tensor in tqdm(reader.tensors, desc="converting weights", unit="tensor", disable=None):
        name = _hf_name(tensor.name)
        if name is None:
            raise ValueError(f"Unexpected tensor {tensor.name!r} in GGUF file; it is not a {arch.architecture} tensor.")
        # Blocks run along a row, so whole rows of blocks permute like rows of values.
        keep = keep_quantized and tensor.tensor_type in SUPPORTED_TYPES and tensor.data.ndim == 2
        values = tensor.data if keep else dequantize(tensor.data, tensor.tensor_type)
        # Only llama.cpp's llama converter interleaves the rotary halves of q and k.
        if arch.architecture == "llama" and ".q_proj." in name:
            values = _unpermute_rotary_rows(values, arch.num_attention_heads)
        elif arch.architecture == "llama" and ".k_proj." in name:
            values = _unpermute_rotary_rows(values, arch.num_key_value_heads)
        elif name.endswith("shared_expert_gate.weight"):
            values = values.reshape(1, -1)  # llama.cpp stores the [1, hidden] gate as a vector
        # Copy: the reader memory-maps the file, and the result must outlive it and be writable.
        if "{}" in name:
            for e, expert in enumerate(values):
                weights[name.format(e)] = torch.from_numpy(np.array(expert)).to(dtype)
        elif keep:
            weights[name] = from_gguf(values, tensor.tensor_type)
        else:
            weights[name] = torch.from_numpy(np.array(values)).to(dtype)
    return weights


def _read_tokenizer(reader: GGUFReader, eos_token_ids: tuple[int, ...]) -> Tokenizer:
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(
            f"GGUF tokenizer type {model!r} is not supported; only byte-level BPE ('gpt2') vocabularies load. "
            "Use the model's Hugging Face directory instead."
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges")
    backend = _byte_level_bpe(tokens, merges, _field(reader, "tokenizer.ggml.pre", None))

    bos = _field(reader, "tokenizer.ggml.bos_token_id", None)
    named_specials = {
        _field(reader, f"tokenizer.ggml.{key}_token_id", None) for key in ("bos", "eos", "unknown", "padding")
    }
    token_types = _field(reader, "tokenizer.ggml.token_type", [])
    vocab = backend.get_vocab()
    # Only tokens whose text maps back to their own id: llama.cpp sometimes marks as control a token
    # whose text is not byte-level spelled, and adding that text would create a new id past the vocab.
    special = [i for i, kind in enumerate(token_types) if kind == TokenType.CONTROL or i in named_specials]
    backend.add_special_tokens(
        [AddedToken(tokens[i], normalized=False, special=True) for i in special if vocab.get(tokens[i]) == i]
    )
    user_defined = [i for i, kind in enumerate(token_types) if kind == TokenType.USER_DEFINED]
    # Not special (kept when decoding) but always matched whole, as llama.cpp does.
    backend.add_tokens([AddedToken(tokens[i], normalized=False) for i in user_defined if vocab.get(tokens[i]) == i])

    return Tokenizer(
        backend,
        chat_template=_field(reader, "tokenizer.chat_template", None),
        bos_token_id=bos,
        eos_token_ids=eos_token_ids,
        add_bos_token=_field(reader, "tokenizer.ggml.add_bos_token", False),
    )


@cache
def _byte_spelling() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table: printable Latin-1 bytes stand for
    # themselves, the rest are shifted to code points from 256 up.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None) -> BackendTokenizer:
    spelling = _byte_spelling()
    alphabet = set(spelling.values())
    # Some converters store a token's raw text instead of its byte-level spelling; respell those.
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): i
        for i, token in enumerate(tokens)
    }
    backend = BackendTokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges], fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    return backend


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in _PRE_TOKENIZER_SPLITS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_PRE_TOKENIZER_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre == "smollm":
        # SmolLM's own tokenizer.json: single digits, then GPT-2's split.
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    if pre not in _GPT2_PRE_TOKENIZERS:
        log.warning("Unknown GGUF pre-tokenizer %r; splitting text like GPT-2, which may not match the model.", pre)
    return pre_tokenizers.ByteLevel(add_prefix_space=False)
