"""Build a GGUF file's tokenizer: byte-level BPE (``tokenizer.ggml.model == "gpt2"``) from its tokens and
merges, or SentencePiece BPE (``"llama"``: Llama 2, Mistral, Gemma, Phi-3) from its pieces and scores."""

import logging
from functools import cache

from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from spyglass.core.loaders.gguf_config import field as _field
from spyglass.core.tokenizer import Tokenizer

log = logging.getLogger(__name__)

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


def read_tokenizer(reader: GGUFReader, eos_token_ids: tuple[int, ...]) -> Tokenizer:
    """The tokenizer the file's ``tokenizer.ggml.*`` metadata describes; ValueError for other vocabularies."""
    model = _field(reader, "tokenizer.ggml.model")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    token_types = _field(reader, "tokenizer.ggml.token_type", [])
    if model == "gpt2":
        merges = _field(reader, "tokenizer.ggml.merges")
        backend = _byte_level_bpe(tokens, merges, _field(reader, "tokenizer.ggml.pre", None))
    elif model == "llama":
        backend = _sentencepiece_bpe(
            tokens,
            _field(reader, "tokenizer.ggml.scores"),
            token_types,
            _field(reader, "tokenizer.ggml.unknown_token_id", None),
            _field(reader, "tokenizer.ggml.add_space_prefix", True),
        )
    else:
        raise ValueError(
            f"GGUF tokenizer type {model!r} is not supported; only byte-level BPE ('gpt2') and SentencePiece "
            "BPE ('llama') vocabularies load. Use the model's Hugging Face directory instead."
        )

    bos = _field(reader, "tokenizer.ggml.bos_token_id", None)
    named_specials = {
        _field(reader, f"tokenizer.ggml.{key}_token_id", None)
        for key in ("bos", "eos", "unknown", "padding")
    }
    vocab = backend.get_vocab()
    # Only tokens whose text maps back to their own id: llama.cpp sometimes marks as control a token whose
    # text is not byte-level spelled (gpt2 vocabularies), and adding that text would create a new id past the vocab.
    special = [
        i for i, kind in enumerate(token_types) if kind == TokenType.CONTROL or i in named_specials
    ]
    backend.add_special_tokens(
        [
            AddedToken(tokens[i], normalized=False, special=True)
            for i in special
            if vocab.get(tokens[i]) == i
        ]
    )
    user_defined = [i for i, kind in enumerate(token_types) if kind == TokenType.USER_DEFINED]
    # Not special (kept when decoding) but always matched whole, as llama.cpp does.
    backend.add_tokens(
        [AddedToken(tokens[i], normalized=False) for i in user_defined if vocab.get(tokens[i]) == i]
    )

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
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
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
    backend = BackendTokenizer(
        models.BPE(vocab, [tuple(m.split(" ")) for m in merges], fuse_unk=False)
    )
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
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
    if pre not in _GPT2_PRE_TOKENIZERS:
        log.warning(
            "Unknown GGUF pre-tokenizer %r; splitting text like GPT-2, which may not match the model.",
            pre,
        )
    return pre_tokenizers.ByteLevel(add_prefix_space=False)


_SPACE = "\u2581"  # SentencePiece's visible space


def _sentencepiece_bpe(
    tokens: list[str],
    scores: list[float],
    token_types: list[int],
    unk_id: int | None,
    add_space_prefix: bool,
) -> BackendTokenizer:
    """SentencePiece BPE as llama.cpp runs it: spaces become ``▁`` (one prepended when the vocabulary says
    so), then the adjacent pair whose merged piece scores highest merges first, and characters no piece
    covers fall back to their UTF-8 bytes' ``<0xXX>`` pieces. As BPE merges, ranked by the merged piece's
    score. (Equal scores merge leftmost first in llama.cpp and in merge-list order here; real vocabularies
    score every piece differently.)"""
    vocab = {}
    for i, token in enumerate(tokens):
        vocab.setdefault(token, i)
    unk = tokens[unk_id] if unk_id is not None else None
    model = models.BPE(
        vocab,
        _merges_by_score(tokens, scores, token_types, vocab),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = BackendTokenizer(model)
    prefix = [normalizers.Prepend(_SPACE)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*prefix, normalizers.Replace(" ", _SPACE)])
    strip = [decoders.Strip(" ", 1, 0)] if add_space_prefix else []
    backend.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return backend


def _merges_by_score(
    tokens: list[str], scores: list[float], token_types: list[int], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    # Every way to build a normal piece from two pieces, the best-scoring merged piece first. Control,
    # byte and unknown pieces are never the result of a merge (llama.cpp only merges text).
    mergeable = {TokenType.NORMAL, TokenType.USER_DEFINED}
    ranked = []
    for i, token in enumerate(tokens):
        if len(token) < 2 or (token_types and token_types[i] not in mergeable) or vocab[token] != i:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, cut, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]
