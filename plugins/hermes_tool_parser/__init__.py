"""The Hermes tool-call format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call.

Qwen2.5's chat template and SmolLM2's tool-use training data write calls this way, and the HTTP
API's fallback tool prompt asks models without a tool template for it. A block that is not such a
JSON object stays in the content: what cannot be parsed is shown, never dropped.

Parsing is incremental: once ``<tool_call>{"name": "x", "arguments": `` has been generated the call
starts, and its arguments stream as the model writes them. The arguments are the model's own text
(valid JSON when the call is complete; a call cut by ``max_tokens`` keeps what was written).
``strict_grammar`` is the format as a grammar, for OpenAI's strict functions with ``tool_choice``
auto: any text, and blocks whose calls obey their functions' schemas.
"""

import json

from spyglass.core.plugin_api import (
    CallObjectScanner,
    StreamingToolCallParser,
    StrippedContent,
    ToolCallParser,
    ToolCallPiece,
    calls_schema,
    hookimpl,
    split_at_tag,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesToolCallParser(StreamingToolCallParser):
    """Finds ``<tool_call>`` blocks (an unterminated last one too, as a length cut leaves it)."""

    def stream(self) -> "HermesToolCallStream":
        """A fresh incremental parse."""
        return HermesToolCallStream()

    def strict_grammar(self, arguments: dict[str, dict], parallel: bool) -> str:
        """Any text, with ``<tool_call>`` blocks holding one call each: the text before a block is
        lazy (it ends at the first ``<tool_call>``, which must open a valid call), and the text
        after the last block never holds another ``<tool_call>``."""
        call = calls_schema(arguments)
        return "\n".join(
            [
                f"start: call{'*' if parallel else '?'} END",
                f'call: before_call SPACE call_object SPACE "{CLOSE}"',
                f'before_call[lazy]: TEXT "{OPEN}"',
                "TEXT: /(?s:.*)/",
                f"END: TEXT & ~/(?s:.*){OPEN}(?s:.*)/",
                r"SPACE: /[ \t\n]*/",
                f"call_object: %json {json.dumps(call)}",
            ]
        )


class HermesToolCallStream:
    """Content is passed on as it comes, except what may be the start of ``<tool_call>``; inside a block the
    call's name and arguments stream as soon as they are written.

    Content is stripped as a whole, as the non-streamed parse always did: leading whitespace is
    dropped and whitespace is held until more content follows it.
    """

    def __init__(self):
        self._buffer = ""
        self._block: CallObjectScanner | None = None
        self._num_calls = 0
        self._content_text = StrippedContent()

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the output."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        while self._buffer:
            if self._block is None:
                split = split_at_tag(self._buffer, OPEN)
                self._content(split.before, pieces)
                self._buffer = split.after
                if not split.found:
                    break
                self._block = CallObjectScanner(self._num_calls)
                continue
            block, new_text, self._buffer = self._block, self._buffer, ""
            pieces += block.feed(new_text)
            close = self._find_close(block)
            if close < 0:
                break
            self._buffer = block.text[close + len(CLOSE) :]
            self._end_block(block.text[:close], pieces, closed=True)
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """The held text: an unterminated block (a call if it started as one), or a partial ``<tool_call>`` tag."""
        pieces: list[ToolCallPiece] = []
        if self._block is not None:
            self._end_block(self._block.text, pieces, closed=False)
        elif self._buffer:
            self._content(self._buffer, pieces)
        self._buffer = ""
        return pieces

    def _find_close(self, block: CallObjectScanner) -> int:
        # Not inside the arguments: a closing tag there is text the model wrote in a string.
        if block.args_start is not None and block.args_end is None:
            return -1
        return block.text.find(CLOSE, block.args_end or 0)

    def _end_block(self, text: str, pieces: list[ToolCallPiece], closed: bool) -> None:
        block, self._block = self._block, None
        found = block.finish(text)
        if found is None:
            self._content(OPEN + text + (CLOSE if closed else ""), pieces)
            return
        pieces += found
        self._num_calls += 1

    def _content(self, text: str, pieces: list[ToolCallPiece]) -> None:
        pieces += self._content_text.pieces(text)


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The Hermes parser, for ``name`` ``hermes``."""
    return HermesToolCallParser() if name == "hermes" else None
