"""The pythonic tool-call format: the answer is a Python list of calls, ``[f(a=1), g(b="x")]``.

Llama 3.2's and Llama 4's pythonic chat templates ask for this (vLLM's ``pythonic`` parser reads
the same), as do ToolACE-style fine-tunes. Arguments are keywords with Python literal values
(strings, numbers, ``True``/``False``/``None``, lists, dicts), returned as a JSON object. An answer
that does not start with ``[`` is content, and so is a list element that is no such call, with
everything after it: what cannot be parsed is shown, never dropped. Text after the list is content.

Parsing is incremental, a call at a time: each comes whole (name and arguments) when its ``)``
closes, as a Python literal cannot be turned into JSON before it is complete. No
strict grammar: strict functions with ``tool_choice`` auto are a 400 here.
"""

import ast
import json
import re

from spyglass.core.plugin_api import (
    StreamingToolCallParser,
    StrippedContent,
    ToolCallParser,
    ToolCallPiece,
    hookimpl,
)

_CALL_START = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_NAME_SO_FAR = re.compile(r"[A-Za-z_][\w.]*\s*")


class PythonicToolCallParser(StreamingToolCallParser):
    """Finds the list of calls an answer consists of (a call cut short is left as content)."""

    def stream(self) -> "PythonicToolCallStream":
        """A fresh incremental parse."""
        return PythonicToolCallStream()


class PythonicToolCallStream:
    """Content streams as it comes once the answer shows it is no list of calls; each call comes
    once it closes."""

    def __init__(self):
        self._buffer = ""
        self._state = "start"  # start | list (between calls) | call (inside one) | content
        self._element = ""  # the current list element's text: content again if it is no call
        self._scanned = 0
        self._depth = 0
        self._quote = ""
        self._escaped = False
        self._name = ""
        self._num_calls = 0
        self._content = StrippedContent()

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the output."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        step = {
            "start": self._at_start,
            "list": self._between_calls,
            "call": self._in_call,
            "content": self._in_content,
        }
        while self._buffer and step[self._state](pieces):
            pass
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """The held text is content: a start, or a call, that never completed."""
        pieces = self._content.pieces(self._element + self._buffer)
        self._buffer = self._element = ""
        return pieces

    def _at_start(self, pieces: list[ToolCallPiece]) -> bool:
        rest = self._buffer.lstrip()
        if not rest:
            return False
        if rest.startswith("["):
            self._element, self._buffer = (
                self._buffer[: len(self._buffer) - len(rest) + 1],
                rest[1:],
            )
            self._state = "list"
        else:
            self._state = "content"
        return True

    def _in_content(self, pieces: list[ToolCallPiece]) -> bool:
        pieces += self._content.pieces(self._buffer)
        self._buffer = ""
        return False

    def _between_calls(self, pieces: list[ToolCallPiece]) -> bool:
        rest = self._buffer.lstrip()
        if self._num_calls and rest.startswith(","):
            rest = rest[1:].lstrip()
        if not rest:
            return False
        if rest.startswith("]") and self._num_calls:
            self._buffer, self._element, self._state = rest[1:], "", "content"
            return True
        started = _CALL_START.match(rest)
        if started is None:
            so_far = _NAME_SO_FAR.match(rest)
            if so_far is not None and so_far.end() == len(rest):
                return False  # a name still being written
            return self._not_a_call()
        self._element += self._buffer[: len(self._buffer) - len(rest)]
        self._element += rest[: started.end()]
        self._buffer = rest[started.end() :]
        self._scanned, self._depth, self._quote, self._escaped = 0, 1, "", False
        self._name, self._state = started[1], "call"
        return True

    def _in_call(self, pieces: list[ToolCallPiece]) -> bool:
        end = self._call_end()
        if end is None:
            return False
        call = self._element + self._buffer[:end]
        arguments = _keyword_arguments(call[call.index("(") :])
        if arguments is None:
            return self._not_a_call()
        pieces.append(ToolCallPiece("call", self._name, self._num_calls))
        pieces.append(ToolCallPiece("arguments", arguments, self._num_calls))
        self._num_calls += 1
        self._buffer, self._element, self._state = self._buffer[end:], "", "list"
        return True

    def _call_end(self) -> int | None:
        """Where in the buffer the call's closing parenthesis ends, once written (Python strings
        and brackets tracked, so that one inside a string or a literal does not count)."""
        text, i = self._buffer, self._scanned
        while i < len(text):
            char = text[i]
            i += 1
            if self._escaped:
                self._escaped = False
            elif self._quote:
                if char == "\\":
                    self._escaped = True
                elif char == self._quote:
                    self._quote = ""
            elif char in "'\"":
                self._quote = char
            elif char in "([{":
                self._depth += 1
            elif char in ")]}":
                self._depth -= 1
                if self._depth == 0:
                    return i
        self._scanned = i
        return None

    def _not_a_call(self) -> bool:
        """The element (and all after it) is content after all."""
        self._buffer = self._element + self._buffer
        self._element, self._state = "", "content"
        return True


def _keyword_arguments(parenthesized: str) -> str | None:
    """``(a=1, b="x")`` as the JSON object ``{"a": 1, "b": "x"}``; None unless every argument is a
    keyword with a literal value JSON can hold."""
    try:
        call = ast.parse(f"f{parenthesized}", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            return None
        values = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
        if len(values) != len(call.keywords):
            return None
        return json.dumps(values)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        return None


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The pythonic parser, for ``name`` ``pythonic``."""
    return PythonicToolCallParser() if name == "pythonic" else None
