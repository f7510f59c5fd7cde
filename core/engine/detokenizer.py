"""Incremental detokenisation with stop strings: text grows token by token, never with a broken character."""

from collections import deque

from tokenizers.decoders import DecodeStream

from spyglass.core.tokenizer import Tokenizer

# Tokens of context decoded before the new ones, so that merges and leading spaces come out right.
_CONTEXT_TOKENS = 6
# A character is at most 4 bytes and a token holds at least one, so a character that may still be
# completed starts within the last 3 held-back tokens, and a run of this many held back (a model
# repeating a stray byte, or a client's logit_bias forcing one) cannot all be finishing one.
_STILL_COMPLETING = 3
_MAX_HELD_TOKENS = 8
# How `DecodeStream.step` says that the text of its window no longer starts with what it showed.
_INVALID_PREFIX = "Invalid prefix encountered"


class IncrementalDetokenizer:
    """Turns a request's output tokens into text as they arrive.

    A token that ends inside a multi-byte character decodes to U+FFFD; its text is held back
    until the character completes (bytes that complete nothing, such as the rest of a character a
    prompt was cut inside, show as U+FFFD, as a decode of the output alone shows them). Text that
    could be the start of a stop string is held back too (`visible_text`), and a matched stop
    string ends the text (included only with ``include_stop``). The text of the first
    ``min_tokens`` tokens is not searched for stop strings, and ``skip_special_tokens=False``
    keeps special tokens' text.

    The stream decodes every held-back token again at each step, so a long run of tokens that
    complete nothing would cost each step more than the last; after `_MAX_HELD_TOKENS` of them
    the text of all but the last few is shown (U+FFFD for the stray bytes) and the stream restarts
    after them.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        stop: list[str],
        *,
        min_tokens: int = 0,
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ):
        self.backend = tokenizer.backend
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        # A prompt ending inside a character leaves the context out: the stream would show its text.
        if self._decode(context).endswith("\ufffd"):
            context = []
        # The last tokens whose text is out (where the stream restarts), and those held back since.
        self.context: deque[int] = deque(context, maxlen=_CONTEXT_TOKENS)
        self.held: list[int] = []
        # The tokenizers library keeps the decoding window (one call per token, in Rust).
        self.stream = self._new_stream()
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.include_stop = include_stop
        # Stop strings are looked for only in the text of tokens after the first ``min_tokens``.
        self.min_tokens = min_tokens
        self.num_tokens = 0
        self.stop_floor = 0
        self.text = ""
        self.matched_stop: str | None = None
        self.num_restarts = 0
        """How often the stream restarted after bytes that made no valid UTF-8 (`_restart_after`)."""

    def add_token(self, token_id: int) -> None:
        """Append one token's text (when complete); sets `matched_stop` when a stop string appears."""
        self.num_tokens += 1
        new_text = self._step(token_id)
        if len(self.held) >= _MAX_HELD_TOKENS:
            new_text = self._release_held()
        if not new_text:
            return
        search_from = self._search_start(len(self.text))
        self.text += new_text
        if self.num_tokens <= self.min_tokens:
            self.stop_floor = len(self.text)
        elif self.stop:
            self._find_stop(search_from)

    def _search_start(self, old_length: int) -> int:
        """Where a stop string completed by text after ``old_length`` characters may start."""
        return max(self.stop_floor, old_length - self.holdback)

    def _new_stream(self) -> DecodeStream:
        """A decoding window that starts after the context."""
        return DecodeStream(ids=list(self.context), skip_special_tokens=self.skip_special_tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _step(self, token_id: int) -> str | None:
        """The stream's text for one more token, None while it is held back."""
        try:
            new_text = self.stream.step(self.backend, token_id)
        except Exception as error:  # the tokenizers library raises a bare Exception
            if not str(error).startswith(_INVALID_PREFIX):
                raise
            return self._restart_after(token_id)
        if new_text is None:
            self.held.append(token_id)
        else:
            self.context.extend(self.held)
            self.context.append(token_id)
            self.held.clear()
        return new_text

    def _restart_after(self, token_id: int) -> str:
        """Byte-fallback vocabularies decode a run of byte tokens that is no longer valid UTF-8 as
        U+FFFD, bytes already shown as letters included, so the stream's text is no longer a prefix
        of itself. The text shown stays; the held tokens and this one are decoded on their own, and
        the stream restarts after them."""
        self.num_restarts += 1
        ids = [*self.held, token_id]
        text = self._after_context(ids)
        self.held = []
        if not text.endswith("\ufffd"):  # else the old context stays the clean place to restart
            self.context.extend(ids)
        self.stream = self._new_stream()
        return text

    def _release_held(self) -> str:
        """The text of the held-back tokens but the last few, as a decode of them all shows it; the
        stream restarts after the context and takes those few again."""
        held, text_of = self.held, self._after_context
        whole = text_of(held)
        # The longest head whose text and the rest's (after the context, as the restarted stream
        # reads it) make the whole run's: a character the head's last bytes start and the rest's
        # complete would otherwise come out broken.
        split = next(
            (
                k
                for k in range(len(held) - _STILL_COMPLETING, 0, -1)
                if text_of(held[:k]) + text_of(held[k:]) == whole
            ),
            len(held) - _STILL_COMPLETING,
        )
        text = text_of(held[:split])
        kept, self.held = held[split:], []
        self.stream = self._new_stream()
        for token_id in kept:
            text += self._step(token_id) or ""
        return text

    def _with_held_text(self) -> str:
        """The text with that of the held-back tokens after it, but for the U+FFFD of a character
        they leave unfinished (left out, as vLLM leaves it out), cut at a stop string they complete."""
        if not self.held:
            return self.text
        text = self.text + self._after_context(self.held).rstrip("\ufffd")
        if self.num_tokens <= self.min_tokens:
            return text
        hit = self._first_stop(text, self._search_start(len(self.text)))
        return text if hit is None else self._cut(text, hit)

    def _after_context(self, ids: list[int]) -> str:
        """``ids``' text where they follow the context (the last tokens whose text is out)."""
        context = list(self.context)
        return self._decode(context + ids)[len(self._decode(context)) :]

    def _first_stop(self, text: str, search_from: int) -> tuple[int, str] | None:
        """Where the earliest stop string in ``text`` from ``search_from`` starts, and which it is."""
        hits = [(i, s) for s in self.stop if (i := text.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _find_stop(self, search_from: int) -> None:
        hit = self._first_stop(self.text, search_from)
        if hit is not None:
            self.matched_stop = hit[1]
            self.text = self._cut(self.text, hit)

    def _cut(self, text: str, hit: tuple[int, str]) -> str:
        """``text`` up to the stop string found at ``hit``, or through it with ``include_stop``."""
        index, stop = hit
        return text[: index + len(stop)] if self.include_stop else text[:index]

    def visible_text(self, finished: bool) -> str:
        """The text safe to show now: all of it once finished (with the complete characters of the
        held-back tokens), else without a possible stop-string start."""
        if self.matched_stop is not None:
            return self.text
        if finished:
            return self._with_held_text()
        if not self.stop or self.include_stop:
            # A stop string that completes later ends after all of this text: none of it is cut.
            return self.text
        # Clamped: while the text is shorter than the holdback a negative end would slice from the back.
        return self.text[: max(self.stop_floor, len(self.text) - self.holdback)]
