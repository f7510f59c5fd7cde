"""Tool calls in generated text: the parser protocol a plugin provides, the pieces it streams, and the calls it finds.

A parser reads the model's text as it grows and hands back `ToolCallPiece`s: plain content, the
start of a call (its name, once written), and fragments of the call's arguments. The API streams
those pieces as they come (OpenAI's ``tool_calls`` deltas, Anthropic's ``input_json_delta``, the
Responses API's ``function_call_arguments.delta``), and a whole answer is the same pieces
collected, so a streamed answer always assembles to the non-streamed one.
"""

import json
import re
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One call the model wrote: the function's name and its arguments as a JSON object string."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    """A piece of parsed output: ``content`` text, the ``call`` ``index`` starting (``text`` is its name), or an
    ``arguments`` fragment of call ``index`` (fragments concatenate to its arguments)."""

    kind: Literal["content", "call", "arguments"]
    text: str
    index: int = 0


class ToolCallStream(Protocol):
    """One output's incremental parse: feed text as it is generated, then finish."""

    def feed(self, text: str) -> list[ToolCallPiece]:
        """The pieces that ``text`` (the next part of the output) completes; text that may still turn out to be part
        of a call is held back."""
        ...

    def finish(self) -> list[ToolCallPiece]:
        """The output ended: the pieces still held."""
        ...


class ToolCallParser(Protocol):
    """Splits a model's output into plain content and tool calls, for one tool-call format.

    Optional: ``reads_special_tokens = True`` for a format whose markers are special tokens
    (Mistral's ``[TOOL_CALLS]``): answers it parses keep special tokens' text (vLLM's
    ``skip_special_tokens: false``), as the markers would otherwise not be in the text.
    """

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """``(content, calls)``: the text outside the calls (None when there is none) and the calls, in order."""
        ...

    def stream(self) -> ToolCallStream:
        """A fresh incremental parse of one output. Optional: without it the API holds a choice's text to its end."""
        ...

    def strict_grammar(self, arguments: dict[str, dict], parallel: bool) -> str:
        """A grammar (llguidance's Lark dialect) of the outputs this format parses: any content, and
        calls of the functions named in ``arguments`` whose arguments obey the JSON schema given
        for each; at most one call unless ``parallel``. Optional: it is what makes OpenAI's
        ``strict`` functions hold with ``tool_choice`` auto, which without it is a 400."""
        ...

    def with_tools(self, tools: list[dict]) -> "ToolCallParser":
        """The parser for one request's offered tools (HF's format: ``{"type": "function",
        "function": {"name", "parameters", ...}}``), for formats that need their schemas to read
        calls (Qwen3-Coder's, whose values are written untyped). Optional: without it the same
        parser reads every request's answers."""
        ...

    def prompt_call_id(self, call_id: str) -> str:
        """How the chat template should see the id of an earlier call (in the assistant turn
        and in its result alike), for formats whose templates accept only their own kind of
        ids (Mistral's: 9 letters and digits). Optional: without it ids reach it unchanged."""
        ...


class StrippedContent:
    """An output's content pieces, the content stripped as a whole (as a non-streamed parse strips
    it): leading whitespace is dropped, and whitespace is held until more content follows it."""

    def __init__(self):
        self._started = False
        self._pending_space = ""

    def pieces(self, text: str) -> list[ToolCallPiece]:
        """The content piece ``text`` adds (none while it is only whitespace)."""
        if not self._started:
            text = text.lstrip()
        stripped = text.rstrip()
        if not stripped:
            self._pending_space += text
            return []
        self._started = True
        piece = ToolCallPiece("content", self._pending_space + stripped)
        self._pending_space = text[len(stripped) :]
        return [piece]


class StreamingToolCallParser:
    """A base for parsers that parse incrementally: a subclass gives ``stream``, and ``parse`` is
    what its stream assembles to (so a streamed answer always matches the whole one)."""

    def stream(self) -> ToolCallStream:
        """A fresh incremental parse of one output."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """The whole output's content and calls: the stream's pieces, collected."""
        return parse_whole(self.stream(), text)


def parse_whole(stream: ToolCallStream, text: str) -> tuple[str | None, list[ParsedToolCall]]:
    """``(content, calls)`` of a whole output: ``stream``'s pieces for it, collected, so that a
    parser's ``parse`` is what its stream assembles to."""
    return collect(stream.feed(text) + stream.finish())


def calls_schema(arguments: dict[str, dict], key: str = "arguments") -> dict:
    """The JSON schema of one call of the functions ``arguments`` names: an object holding the
    function's ``name`` and, under ``key``, arguments obeying its schema (``anyOf`` for several)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, key: schema},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for name, schema in arguments.items()
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def collect(pieces: list[ToolCallPiece]) -> tuple[str | None, list[ParsedToolCall]]:
    """``(content, calls)`` assembled from pieces, as a client assembles a stream."""
    content = "".join(piece.text for piece in pieces if piece.kind == "content")
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for piece in pieces:
        if piece.kind == "call":
            names[piece.index] = piece.text
        elif piece.kind == "arguments":
            arguments.setdefault(piece.index, []).append(piece.text)
    calls = [ParsedToolCall(names[i], "".join(arguments.get(i, []))) for i in sorted(names)]
    return content or None, calls


def merge(pieces: list[ToolCallPiece]) -> list[ToolCallPiece]:
    """Adjacent content pieces, and adjacent argument fragments of one call, joined: fewer events, same text."""
    merged: list[ToolCallPiece] = []
    for piece in pieces:
        last = merged[-1] if merged else None
        if last and piece.kind == last.kind != "call" and piece.index == last.index:
            merged[-1] = ToolCallPiece(piece.kind, last.text + piece.text, piece.index)
        else:
            merged.append(piece)
    return merged


def parse_call(text: str) -> ParsedToolCall | None:
    """A call from a whole ``{"name": ..., "arguments": {...}}`` object (``parameters`` also accepted), or None."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ParsedToolCall(
        value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)
    )


_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(\S)'
)


class CallObjectScanner:
    """Streams one ``{"name": ..., "arguments": {...}}`` object as it is written: the call once its name is,
    then the arguments object's text as it grows.

    Objects in another shape (keys in another order, arguments as a string) are parsed whole when
    they end (`finish`). ``closed`` tells when the object's closing brace has been seen, ``end``
    where (in ``text``), and ``args_end`` where the arguments object closed.
    """

    def __init__(self, index: int):
        self.index = index
        self.text = ""
        self.name: str | None = None
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.end: int | None = None
        self._scanned = self._emitted = self._depth = self._args_depth = 0
        self._in_string = self._escaped = False

    @property
    def closed(self) -> bool:
        """Whether the object's closing brace has been seen."""
        return self.end is not None

    def feed(self, text: str) -> list[ToolCallPiece]:
        """The call and argument pieces ``text`` adds."""
        self.text += text
        pieces = []
        if self.name is None and self.args_start is None:
            match = _HEAD.match(self.text)
            if match is not None and match[2] == "{":
                try:
                    self.name = json.loads(f'"{match[1]}"')
                except json.JSONDecodeError:
                    pass
                else:
                    self.args_start = self._emitted = match.start(2)
                    pieces.append(ToolCallPiece("call", self.name, self.index))
        self._scan()
        if self.args_start is not None:
            stop = self.args_end if self.args_end is not None else self._scanned
            if stop > self._emitted:
                pieces.append(
                    ToolCallPiece("arguments", self.text[self._emitted : stop], self.index)
                )
                self._emitted = stop
        return pieces

    def _scan(self) -> None:
        # Tracks JSON nesting outside strings: enough to tell where the arguments and the object end.
        text, i = self.text, self._scanned
        while i < len(text) and self.end is None:
            char = text[i]
            if i == self.args_start:
                self._args_depth = self._depth
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if (
                    self.args_start is not None
                    and self.args_end is None
                    and self._depth == self._args_depth
                ):
                    self.args_end = i
                if self._depth == 0:
                    self.end = i
        self._scanned = i

    def finish(self, text: str | None = None) -> list[ToolCallPiece] | None:
        """At the object's end: no more pieces for a call already streamed; for an object in another shape the
        whole call from ``text`` (default: everything fed), or None when it is no call."""
        if self.name is not None:
            return []
        call = parse_call(self.text if text is None else text)
        if call is None:
            return None
        return [
            ToolCallPiece("call", call.name, self.index),
            ToolCallPiece("arguments", call.arguments, self.index),
        ]


class BufferedToolCallStream:
    """For a parser without ``stream``: holds the whole output and parses it at the end."""

    def __init__(self, parser: ToolCallParser):
        self.parser = parser
        self._pieces: list[str] = []  # joined once at the end: not copied whole at every token

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Nothing until the end."""
        self._pieces.append(text)
        return []

    def finish(self) -> list[ToolCallPiece]:
        """The parser's content, then each call whole."""
        content, calls = self.parser.parse("".join(self._pieces))
        pieces = [ToolCallPiece("content", content)] if content else []
        for index, call in enumerate(calls):
            pieces += [
                ToolCallPiece("call", call.name, index),
                ToolCallPiece("arguments", call.arguments, index),
            ]
        return pieces
