"""Fill in the middle: OpenAI's completions ``suffix``, the prompt a code model completes between
its ``prompt`` (the code before the cursor) and ``suffix`` (the code after it).

Code models trained to fill in mark the two sides with special tokens of their vocabulary and
generate the middle after them. The format is read from the vocabulary (`fim_tokens`):

- ``<fim_prefix>``, ``<fim_suffix>``, ``<fim_middle>``: StarCoder and StarCoder2, Granite Code,
  Stable Code;
- ``<|fim_prefix|>``, ``<|fim_suffix|>``, ``<|fim_middle|>``: Qwen2.5-Coder, Qwen3-Coder, CodeGemma;
- ``<｜fim▁begin｜>``, ``<｜fim▁hole｜>``, ``<｜fim▁end｜>``: DeepSeek-Coder;

each as ``PREFIX prompt SUFFIX suffix MIDDLE`` (prefix, suffix, middle), and Codestral's
``[SUFFIX] suffix [PREFIX] prompt`` (the suffix first; the middle follows the prompt).
"""

from dataclasses import dataclass

from spyglass.core.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class FimTokens:
    """A model's fill-in-the-middle token ids, and whether its suffix comes first (Codestral's)."""

    prefix: int
    suffix: int
    middle: int | None
    suffix_first: bool = False

    def prompt(self, head: list[int], before: list[int], after: list[int]) -> list[int]:
        """The ids the model completes: ``head`` (BOS, if any), then the code ``before`` and
        ``after`` the hole, each behind its marker, as the model was trained."""
        if self.suffix_first:
            return [*head, self.suffix, *after, self.prefix, *before]
        return [*head, self.prefix, *before, self.suffix, *after, self.middle]


_FORMATS = (  # (prefix, suffix, middle) token names; None: the suffix comes first, no middle
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    ("[PREFIX]", "[SUFFIX]", None),
)


def fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The first format of `_FORMATS` whose tokens are all in the vocabulary; None without one."""
    for names in _FORMATS:
        prefix, suffix, middle = (
            tokenizer.backend.token_to_id(name) if name else None for name in names
        )
        if prefix is not None and suffix is not None and (middle is not None or names[2] is None):
            return FimTokens(prefix, suffix, middle, suffix_first=names[2] is None)
    return None
