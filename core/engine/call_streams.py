"""The tool calls of one answer, streamed the way the request asked for them.

``tool_choice`` auto reads calls in the model's own format (a `ToolCallParser` plugin's); required
or named calls are JSON a grammar writes (`JsonCallsStream`); ``parallel_tool_calls: false`` keeps
the first call only (`FirstCallStream`). The API streams these pieces to clients, and plugins read
a finished answer the same way (`spyglass.core.engine.answer_reading`).
"""

from collections.abc import Sequence

from spyglass.core.engine.tool_calls import (
    BufferedToolCallStream,
    CallObjectScanner,
    ToolCallParser,
    ToolCallPiece,
    ToolCallStream,
)


class JsonCallsStream:
    """The incremental parse of a constrained answer: one call object, or a JSON array of them (``parallel``).

    The grammar fixes the shape, so each object's name and arguments stream like a Hermes block's.
    """

    def __init__(self, parallel: bool):
        self.parallel = parallel
        self._buffer = ""
        self._call: CallObjectScanner | None = None
        self._num_calls = 0

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the answer."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        while self._buffer:
            if self._call is None:
                self._buffer = self._buffer.lstrip(" \t\n\r[,]")
                if not self._buffer.startswith("{"):
                    self._buffer = ""  # nothing else may appear between calls
                    break
                self._call = CallObjectScanner(self._num_calls)
            call, new_text, self._buffer = self._call, self._buffer, ""
            pieces += call.feed(new_text)
            if not call.closed:
                break
            pieces += self._end_call(call.text[: call.end])
            self._buffer = call.text[call.end :]
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """A call cut short keeps what was written."""
        return self._end_call(self._call.text) if self._call is not None else []

    def _end_call(self, text: str) -> list[ToolCallPiece]:
        call, self._call = self._call, None
        self._num_calls += 1
        return call.finish(text) or []


class FirstCallStream:
    """``parallel_tool_calls: false`` with ``auto``: the answer's first call only (OpenAI's promise
    of at most one), its content whole. A strict grammar holds the model to one call; without
    one, calls it writes after the first are left out of the response."""

    def __init__(self, stream: ToolCallStream):
        self.stream = stream

    def feed(self, text: str) -> list[ToolCallPiece]:
        """The pieces of the next text, but for later calls'."""
        return self._first(self.stream.feed(text))

    def finish(self) -> list[ToolCallPiece]:
        """The held pieces, but for later calls'."""
        return self._first(self.stream.finish())

    @staticmethod
    def _first(pieces: list[ToolCallPiece]) -> list[ToolCallPiece]:
        return [piece for piece in pieces if piece.kind == "content" or piece.index == 0]


def answer_calls_stream(
    parser: ToolCallParser | None, parallel: bool, tools: Sequence[dict]
) -> ToolCallStream:
    """A fresh parse of one answer's calls: in ``parser``'s format (``tool_choice`` auto, for
    the request's offered ``tools`` where the parser needs them), or, with no parser, the JSON
    calls a grammar writes (``tool_choice`` required or named); ``parallel`` false keeps one."""
    if parser is None:
        return JsonCallsStream(parallel)
    with_tools = getattr(parser, "with_tools", None)
    if with_tools is not None:
        parser = with_tools(list(tools))
    stream = getattr(parser, "stream", None)
    parsed = stream() if stream is not None else BufferedToolCallStream(parser)
    return parsed if parallel else FirstCallStream(parsed)
