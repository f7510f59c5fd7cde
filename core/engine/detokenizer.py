"""Incremental detokenisation with stop strings: text grows token by token, never with a broken character."""

import re
from collections import deque

from tokenizers.decoders import DecodeStream

from spyglass.core.engine.growing_text import GrowingText
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
    keeps special tokens' text (but for the stop token that ends the output, `num_textless`).

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
        # One C search for them all: at the leftmost place where any matches, the alternatives are
        # tried in sorted order, so the earliest hit and, among hits there, the least string wins.
        self._stop_pattern = re.compile("|".join(map(re.escape, sorted(stop)))) if stop else None
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.include_stop = include_stop
        # Stop strings are looked for only in the text of tokens after the first ``min_tokens``.
        self.min_tokens = min_tokens
        self.num_tokens = 0
        self.num_textless = 0
        """Output tokens at the end that add no text: the stop token that ended the request (an
        EOS or one of ``stop_token_ids``), unless ``include_stop`` (as vLLM leaves it out)."""
        self.stop_floor = 0
        self._text = GrowingText()
        self._stop_window = ""
        """The text's last `holdback` characters as `_find_stop` last saw them: where a stop string
        that the next text completes may start (none starts before `stop_floor`, which a window
        left behind during ``min_tokens`` never passes)."""
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
        old_length = self._text.length
        self._text.append(new_text)
        if self.num_tokens <= self.min_tokens:
            self.stop_floor = self._text.length
        elif self.stop:
            self._find_stop(old_length, new_text)

    def add_tokens(self, token_ids: list[int]) -> None:
        """Append several tokens' text (`add_token` for each, as the text comes out the same).

        A run of tokens read together (a final-only output's, or those a stream interval held)
        from a clean point (nothing held back, no stop string to look for) is decoded in one call
        after the context, a few times cheaper than a stream's step per token. That text is the
        stream's unless it holds U+FFFD (an unfinished or invalid character, which the stream
        holds back or restarts after): then the run goes token by token after all."""
        if len(token_ids) > 1 and not self.held and not self.stop:
            context = list(self.context)
            whole = self._decode(context + token_ids)
            head = self._decode(context)
            if "\ufffd" not in whole and whole.startswith(head):
                self.num_tokens += len(token_ids)
                self.context.extend(token_ids)
                self.stream = self._new_stream()
                self._text.append(whole[len(head) :])
                return
        for token_id in token_ids:
            self.add_token(token_id)

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

    def _final_since(self, start: int) -> tuple[str, int]:
        """`visible_since` once finished with tokens held back: the text with that of the held-back
        tokens after it, but for the U+FFFD of a character they leave unfinished (left out, as vLLM
        leaves it out), cut at a stop string they complete."""
        search_from = self._search_start(self._text.length)
        tail_from = min(start, search_from)
        tail = self._text.since(tail_from) + self._after_context(self.held).rstrip("\ufffd")
        if self.num_tokens > self.min_tokens:
            hit = self._first_stop(tail, search_from - tail_from)
            if hit is not None:
                tail = tail[: self._cut_length(hit)]
        return tail[start - tail_from :], tail_from + len(tail)

    def _after_context(self, ids: list[int]) -> str:
        """``ids``' text where they follow the context (the last tokens whose text is out)."""
        context = list(self.context)
        return self._decode(context + ids)[len(self._decode(context)) :]

    def _first_stop(self, text: str, search_from: int) -> tuple[int, str] | None:
        """Where the earliest stop string in ``text`` from ``search_from`` starts, and which it is."""
        if self._stop_pattern is None:
            return None
        match = self._stop_pattern.search(text, search_from)
        return None if match is None else (match.start(), match.group())

    def _find_stop(self, old_length: int, new_text: str) -> None:
        """Look for a stop string that ``new_text``, appended after ``old_length`` characters,
        completes: in it and the `_stop_window` before it, not in the whole text."""
        window = self._stop_window + new_text
        window_start = old_length - len(self._stop_window)
        hit = self._first_stop(window, self._search_start(old_length) - window_start)
        if hit is not None:
            self.matched_stop = hit[1]
            self._text.cut(window_start + self._cut_length(hit))
        self._stop_window = window[max(len(window) - self.holdback, 0) :]

    def _cut_length(self, hit: tuple[int, str]) -> int:
        """How much of a text to keep with a stop string found at ``hit``: up to it, or through it
        with ``include_stop``."""
        index, stop = hit
        return index + len(stop) if self.include_stop else index

    @property
    def text(self) -> str:
        """All the text decoded so far (cut at a matched stop string), held-back tokens' not included."""
        return str(self._text)

    def visible_text(self, finished: bool) -> str:
        """The text safe to show now: all of it once finished (with the complete characters of the
        held-back tokens), else without a possible stop-string start."""
        return self.visible_since(0, finished)[0]

    def visible_since(self, start: int, finished: bool) -> tuple[str, int]:
        """`visible_text` from character ``start`` on, and the length of all of it; costs what it
        returns, not the whole text (a delta output reads this at every step)."""
        if finished and self.held and self.matched_stop is None:
            return self._final_since(start)
        end = self._text.length
        if self.matched_stop is None and not finished and self.stop and not self.include_stop:
            # A stop string may yet start in the last ``holdback`` characters: those wait (never
            # before the floor, where no stop string is looked for).
            end = max(self.stop_floor, end - self.holdback)
        return self._text.since(start)[: max(end - start, 0)], end
