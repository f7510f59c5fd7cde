"""Incremental detokenisation with stop strings: text grows token by token, never with a broken character."""

from tokenizers.decoders import DecodeStream

from spyglass.core.tokenizer import Tokenizer

# Tokens of context decoded before the new ones, so that merges and leading spaces come out right.
_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """Turns a request's output tokens into text as they arrive.

    A token that ends inside a multi-byte character decodes to U+FFFD; its text is held back
    until the character completes (bytes that complete nothing, such as the rest of a character a
    prompt was cut inside, show as U+FFFD, as a decode of the output alone shows them). Text that
    could be the start of a stop string is held back too (`visible_text`), and a matched stop
    string ends the text (it is not included).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], stop: list[str]):
        self.backend = tokenizer.backend
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        # A prompt ending inside a character leaves the context out: the stream would show its text.
        if tokenizer.decode(context).endswith("\ufffd"):
            context = []
        # The tokenizers library keeps the decoding window (one call per token, in Rust).
        self.stream = DecodeStream(ids=context, skip_special_tokens=True)
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.matched_stop: str | None = None

    def add_token(self, token_id: int) -> None:
        """Append one token's text (when complete); sets `matched_stop` when a stop string appears."""
        new_text = self.stream.step(self.backend, token_id)
        if not new_text:
            return
        search_from = max(0, len(self.text) - self.holdback)
        self.text += new_text
        if self.stop:
            self._find_stop(search_from)

    def _find_stop(self, search_from: int) -> None:
        hits = [(i, s) for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        if hits:
            index, stop = min(hits)
            self.text = self.text[:index]
            self.matched_stop = stop

    def visible_text(self, finished: bool) -> str:
        """The text safe to show now: all of it once finished, else without a possible stop-string start."""
        if finished or not self.stop or self.matched_stop is not None:
            return self.text
        # Clamped: while the text is shorter than the holdback a negative end would slice from the back.
        return self.text[: max(0, len(self.text) - self.holdback)]
