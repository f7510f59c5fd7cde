"""The Mistral tool-call format: ``[TOOL_CALLS]`` and the calls, in either of Mistral's two layouts.

- Mistral 7B v0.3, Mixtral 8x22B, Mistral NeMo: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]``.
- Mistral Small 3.1 and later (tokenizer v11+): ``[TOOL_CALLS]name[ARGS]{...}``, the marker
  again before each further call.

``[TOOL_CALLS]`` and ``[ARGS]`` are special tokens, so answers parsed by this format keep special
tokens' text (`reads_special_tokens`). Text before the marker and after the calls is content:
what cannot be parsed is shown, never dropped. A call's name and arguments stream as they are
written. Mistral's chat templates accept only call ids of 9 letters and digits, so the ids of
earlier calls reach the template as `prompt_call_id` writes them (the same for a call and its
result). No strict grammar: strict functions with ``tool_choice`` auto are a 400 here.
"""

import json
import re

from spyglass.core.plugin_api import (
    CallObjectScanner,
    StreamingToolCallParser,
    StrippedContent,
    ToolCallParser,
    ToolCallPiece,
    hookimpl,
    split_at_tag,
)

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"([A-Za-z0-9_.\-]+)\s*(\[ARGS\]|\{)")
_NAME_SO_FAR = re.compile(r"[A-Za-z0-9_.\-]*\s*")
_LONGEST_NAME = 128
_NOT_ID = re.compile(r"[^A-Za-z0-9]")


class MistralToolCallParser(StreamingToolCallParser):
    """Finds ``[TOOL_CALLS]`` and the calls after it (an unterminated last one too, as a length cut leaves it)."""

    reads_special_tokens = True

    def stream(self) -> "MistralToolCallStream":
        """A fresh incremental parse."""
        return MistralToolCallStream()

    def prompt_call_id(self, call_id: str) -> str:
        """The last 9 letters and digits of ``call_id`` (zero-padded), as Mistral's templates demand."""
        return _NOT_ID.sub("", call_id)[-9:].rjust(9, "0")


class MistralToolCallStream:
    """Content streams as it comes, except what may be the start of ``[TOOL_CALLS]``; after the
    marker, calls stream as soon as their names are written."""

    def __init__(self):
        self._buffer = ""
        self._state = "content"  # content | marker (just after [TOOL_CALLS]) | array (in [...])
        self._call: CallObjectScanner | None = None
        self._head = ""  # the text the scanner was given before the model's own
        self._written = ""  # the model's text before the scanner's: content again if no call
        self._num_calls = 0
        self._content = StrippedContent()

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the output."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        while self._buffer:
            if self._call is not None:
                done = self._feed_call(pieces)
            elif self._state == "content":
                done = self._take_content(pieces)
            else:
                done = self._open_call(pieces)
            if not done:
                break
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """The held text: a call cut short (kept if it had started), or a partial marker or name."""
        pieces: list[ToolCallPiece] = []
        if self._call is not None:
            pieces += self._end_call(self._call.text, self._call.text[len(self._head) :])
        elif self._buffer:
            marker = TOOL_CALLS if self._state == "marker" else ""
            pieces += self._content.pieces(marker + self._buffer)
        self._buffer = ""
        return pieces

    def _take_content(self, pieces: list[ToolCallPiece]) -> bool:
        """Content up to the marker (True once it is found), holding what may be its start."""
        split = split_at_tag(self._buffer, TOOL_CALLS)
        pieces += self._content.pieces(split.before)
        self._buffer = split.after
        if split.found:
            self._state = "marker"
        return split.found

    def _open_call(self, pieces: list[ToolCallPiece]) -> bool:
        """After the marker, or between an array's calls: open the next call, or go back to
        content; False to wait for more text."""
        if self._state == "array":
            rest = self._buffer.lstrip(" \t\r\n,")
            if not rest:
                return False
            if rest.startswith("{"):
                self._start_call("", self._written if not self._num_calls else "", rest)
            else:  # the array's end, or text that is no call
                self._buffer, self._state = rest.removeprefix("]"), "content"
            return True
        rest = self._buffer.lstrip()
        if rest.startswith("["):
            self._written = TOOL_CALLS + self._buffer[: len(self._buffer) - len(rest) + 1]
            self._buffer, self._state = rest[1:], "array"
            return True
        named = _NAME.match(rest)
        if named is not None:
            head = f'{{"name": {json.dumps(named[1])}, "arguments": '
            start = named.end() if named[2] == ARGS else named.end() - 1
            self._start_call(head, TOOL_CALLS + rest[:start], rest[start:])
            return True
        written = _NAME_SO_FAR.match(rest)
        if len(rest) < _LONGEST_NAME and ARGS.startswith(rest[written.end() :]):
            return False  # a name still being written
        pieces += self._content.pieces(TOOL_CALLS + self._buffer)
        self._buffer, self._state = "", "content"
        return True

    def _start_call(self, head: str, written: str, text: str) -> None:
        self._call = CallObjectScanner(self._num_calls)
        self._head, self._written, self._buffer = head, written, head + text

    def _feed_call(self, pieces: list[ToolCallPiece]) -> bool:
        call, new_text, self._buffer = self._call, self._buffer, ""
        pieces += call.feed(new_text)
        # A named call ends with its arguments object (its head has no closing brace of its own).
        end = call.args_end if self._head else call.end
        if end is None:
            return False
        self._buffer = call.text[end:]
        own = call.text[len(self._head) : end]
        pieces += self._end_call(call.text[:end] + ("}" if self._head else ""), own)
        if self._head:
            self._state = "content"  # text, or the marker before the next call
        return True

    def _end_call(self, text: str, own: str) -> list[ToolCallPiece]:
        """The call ``text`` holds (the scanner's, head included), or the model's ``own`` text of
        it as content when it is none."""
        call, self._call = self._call, None
        found = call.finish(text)
        if found is None:
            self._state = "content"
            return self._content.pieces(self._written + own)
        self._num_calls += 1
        return found


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The Mistral parser, for ``name`` ``mistral``."""
    return MistralToolCallParser() if name == "mistral" else None
