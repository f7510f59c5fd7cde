"""The Llama 3.1 tool-call format: the answer is a JSON call ``{"name": ..., "parameters": {...}}``.

Llama 3.1, 3.2 and 3.3's chat templates ask for this (vLLM's ``llama3_json`` parser reads the
same): with custom tools the model answers with a call object instead of text, optionally after
``<|python_tag|>`` (visible only when special tokens are kept) and, for several calls, separated
by ``;``. An answer that does not start with ``{`` is content, and so is an object that is not a
call (``{"name": ...}`` with ``parameters`` or ``arguments`` and nothing else): a plain JSON
answer stays an answer. Text after the calls is content too: what cannot be parsed is shown,
never dropped.

Parsing is incremental, as the Hermes parser's: once ``{"name": "x", "parameters": `` has been
written the call starts and its arguments stream as the model writes them. ``strict_grammar``
gives the format as a grammar, for OpenAI's strict functions with ``tool_choice`` auto.
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
    partial_suffix,
)

PYTHON_TAG = "<|python_tag|>"
_ARGUMENT_KEYS = ("parameters", "arguments")
_CALL_KEYS = {"name", "type", *_ARGUMENT_KEYS}


class Llama3JsonToolCallParser(StreamingToolCallParser):
    """Finds the call objects an answer consists of (an unterminated last one too, as a length cut leaves it)."""

    def stream(self) -> "Llama3JsonToolCallStream":
        """A fresh incremental parse."""
        return Llama3JsonToolCallStream()

    def strict_grammar(self, arguments: dict[str, dict], parallel: bool) -> str:
        """Either text that does not start with ``{``, or only calls (``;`` between them when
        ``parallel``), each of an offered function with its arguments as ``parameters``."""
        call = calls_schema(arguments, "parameters")
        return "\n".join(
            [
                "start: TEXT | SPACE calls SPACE",
                f"calls: call{' (SEPARATOR call)*' if parallel else ''}",
                r"TEXT: /[ \t\n]*([^{ \t\n](?s:.*))?/",
                r"SPACE: /[ \t\n]*/",
                r"SEPARATOR: /[ \t\n]*;[ \t\n]*/",
                f"call: %json {json.dumps(call)}",
            ]
        )


class Llama3JsonToolCallStream:
    """Content streams as it comes once the answer shows it is no call; a call's name and arguments
    stream as soon as they are written. The start is held while it may still be ``<|python_tag|>``."""

    def __init__(self):
        self._buffer = ""
        self._call: CallObjectScanner | None = None
        self._num_calls = 0
        self._is_content = False
        self._content = StrippedContent()

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the output."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        while self._buffer:
            if self._is_content:
                pieces += self._content.pieces(self._buffer)
                self._buffer = ""
            elif self._call is None:
                if not self._open_call():
                    break
            else:
                call, new_text, self._buffer = self._call, self._buffer, ""
                pieces += call.feed(new_text)
                if not call.closed:
                    break
                self._buffer = call.text[call.end :]
                pieces += self._end_call(call.text[: call.end])
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """The held text: a call cut short (kept if it had started), or a start that never became one."""
        if self._call is not None:
            pieces = self._end_call(self._call.text)
        else:
            pieces = self._content.pieces(self._buffer)
        self._buffer = ""
        return pieces

    def _open_call(self) -> bool:
        """Whether the held text goes on (a call opened, or it turned out to be content); False to wait."""
        rest = self._buffer.lstrip(" \t\r\n;" if self._num_calls else " \t\r\n")
        if self._num_calls == 0 and rest.startswith(PYTHON_TAG):
            rest = rest[len(PYTHON_TAG) :].lstrip()
        elif self._num_calls == 0 and partial_suffix(rest, PYTHON_TAG) == len(rest):
            return False  # whitespace, or what may still become the tag
        if not rest:
            if self._num_calls:
                self._buffer = ""  # separators between calls
            return False
        if rest.startswith("{"):
            self._call = CallObjectScanner(self._num_calls)
            self._buffer = rest
        else:
            self._is_content = True
            if self._num_calls:
                self._buffer = rest
        return True

    def _end_call(self, text: str) -> list[ToolCallPiece]:
        call, self._call = self._call, None
        found = call.finish(text) if call.name is not None or _is_call(text) else None
        if found is None:
            self._is_content = True
            return self._content.pieces(text)
        self._num_calls += 1
        return found


def _is_call(text: str) -> bool:
    """Whether a whole object is a call: a string ``name``, an object of arguments and at most a
    ``type``, as Llama 3.2 sometimes adds."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return False
    if not value.keys() <= _CALL_KEYS:
        return False
    return any(isinstance(value.get(key), dict) for key in _ARGUMENT_KEYS)


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The Llama 3 JSON parser, for ``name`` ``llama3_json``."""
    return Llama3JsonToolCallParser() if name == "llama3_json" else None
