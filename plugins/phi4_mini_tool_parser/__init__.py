"""The Phi-4-mini tool-call format: ``functools[{"name": ..., "arguments": {...}}, ...]``.

Phi-4-mini-instruct (a ``Phi3ForCausalLM``) writes its calls as a JSON array after ``functools``
(vLLM's ``phi4_mini_json`` parser reads the same); ``parameters`` is taken for ``arguments`` too.
Text before the marker and after the array is content, and so is an element that is no call:
what cannot be parsed is shown, never dropped. A call's name and arguments stream as they are
written. No strict grammar: strict functions with ``tool_choice`` auto are a 400 here.
"""

from spyglass.core.plugin_api import (
    CallObjectScanner,
    StreamingToolCallParser,
    StrippedContent,
    ToolCallParser,
    ToolCallPiece,
    hookimpl,
    split_at_tag,
)

MARKER = "functools["


class Phi4MiniToolCallParser(StreamingToolCallParser):
    """Finds the ``functools[...]`` array (an unterminated last call too, as a length cut leaves it)."""

    def stream(self) -> "Phi4MiniToolCallStream":
        """A fresh incremental parse."""
        return Phi4MiniToolCallStream()


class Phi4MiniToolCallStream:
    """Content streams as it comes, except what may be the start of ``functools[``; inside the
    array each call streams once its name is written."""

    def __init__(self):
        self._buffer = ""
        self._in_array = False
        self._call: CallObjectScanner | None = None
        self._num_calls = 0
        self._content = StrippedContent()

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the output."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        while self._buffer:
            if self._call is not None:
                call, new_text, self._buffer = self._call, self._buffer, ""
                pieces += call.feed(new_text)
                if not call.closed:
                    break
                self._buffer = call.text[call.end :]
                pieces += self._end_call(call.text[: call.end])
            elif self._in_array:
                rest = self._buffer.lstrip(" \t\r\n,")
                if not rest:
                    break
                if rest.startswith("{"):
                    self._call, self._buffer = CallObjectScanner(self._num_calls), rest
                elif self._num_calls:  # the array's end, or text after its calls
                    self._buffer, self._in_array = rest.removeprefix("]"), False
                else:  # a marker that opened no call is text after all
                    pieces += self._content.pieces(MARKER)
                    self._buffer, self._in_array = rest, False
            else:
                split = split_at_tag(self._buffer, MARKER)
                pieces += self._content.pieces(split.before)
                self._buffer, self._in_array = split.after, split.found
                if not split.found:
                    break
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """The held text: a call cut short (kept if it had started), or a partial marker."""
        if self._call is not None:
            pieces = self._end_call(self._call.text)
        else:
            held = MARKER if self._in_array and not self._num_calls else ""
            pieces = self._content.pieces(held + self._buffer)
        self._buffer = ""
        return pieces

    def _end_call(self, text: str) -> list[ToolCallPiece]:
        call, self._call = self._call, None
        found = call.finish(text)
        if found is None:
            self._in_array = False
            return self._content.pieces(("" if self._num_calls else MARKER) + text)
        self._num_calls += 1
        return found


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The Phi-4-mini parser, for ``name`` ``phi4_mini_json``."""
    return Phi4MiniToolCallParser() if name == "phi4_mini_json" else None
