"""The Qwen3-Coder tool-call format: XML-like blocks whose parameter values are written bare.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Qwen3-Coder's chat template asks for this (vLLM's ``qwen3_coder`` parser reads the same). A value
is text, so its type comes from the offered function's schema (`with_tools`): a ``string``
parameter keeps the text, ``integer``, ``number`` and ``boolean`` ones are converted, ``object``
and ``array`` ones read as JSON; a value that does not convert, or a parameter the schema does not
name, stays text. The arguments stream as JSON, one parameter at a time as each closes, after the
call's name. Text outside the blocks is content, and a block that is no call stays in it: what
cannot be parsed is shown, never dropped. No strict grammar: strict functions with
``tool_choice`` auto are a 400 here.
"""

import json
import re

from spyglass.core.plugin_api import (
    StreamingToolCallParser,
    StrippedContent,
    ToolCallParser,
    ToolCallPiece,
    hookimpl,
    partial_suffix,
)

BLOCK_OPEN, BLOCK_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
_NAME = re.compile(r"[^<>\n]{1,256}")


class Qwen3CoderToolCallParser(StreamingToolCallParser):
    """Finds ``<tool_call><function=...>`` blocks (and bare ``<function=...>`` ones), typing values by
    the offered functions' schemas."""

    def __init__(self, schemas: dict[str, dict[str, dict]] | None = None):
        self.schemas = schemas or {}
        """Each function's parameter schemas (its JSON schema's ``properties``), by name."""

    def with_tools(self, tools: list[dict]) -> "Qwen3CoderToolCallParser":
        """The parser for one request's offered tools (HF's format): their schemas type the values."""
        schemas = {}
        for tool in tools:
            function = tool["function"]
            schemas[function["name"]] = (function.get("parameters") or {}).get("properties") or {}
        return Qwen3CoderToolCallParser(schemas)

    def stream(self) -> "Qwen3CoderToolCallStream":
        """A fresh incremental parse."""
        return Qwen3CoderToolCallStream(self.schemas)


class Qwen3CoderToolCallStream:
    """Content is passed on as it comes, except what may be the start of a block; a call starts once
    its function's name is written, and each parameter joins its arguments once it closes."""

    def __init__(self, schemas: dict[str, dict[str, dict]]):
        self._schemas = schemas
        self._buffer = ""
        self._state = "content"
        self._unopened = ""  # a block's text before its call starts: content again if it never does
        self._function: dict[str, dict] = {}
        self._parameter = ""
        self._num_parameters = 0
        self._num_calls = 0
        self._content = StrippedContent()

    def feed(self, text: str) -> list[ToolCallPiece]:
        """Pieces for the next part of the output."""
        self._buffer += text
        pieces: list[ToolCallPiece] = []
        step = {
            "content": self._in_content,
            "block": self._in_block,
            "name": self._in_name,
            "parameters": self._in_parameters,
            "value": self._in_value,
            "after": self._after_function,
        }
        while self._buffer and step[self._state](pieces):
            pass
        return pieces

    def finish(self) -> list[ToolCallPiece]:
        """The held text: a block whose call never started is content; a call cut short keeps the
        parameters that closed."""
        pieces: list[ToolCallPiece] = []
        if self._state in ("parameters", "value") and not self._num_parameters:
            pieces.append(self._arguments("{}"))
        elif self._state in ("content", "after"):
            pieces += self._content.pieces(self._buffer)
        elif self._state in ("block", "name"):
            pieces += self._content.pieces(self._unopened + self._buffer)
        self._buffer = ""
        return pieces

    def _in_content(self, pieces: list[ToolCallPiece]) -> bool:
        starts = [
            (at, tag) for tag in (BLOCK_OPEN, FUNCTION_OPEN) if (at := self._buffer.find(tag)) >= 0
        ]
        if not starts:
            keep = max(partial_suffix(self._buffer, tag) for tag in (BLOCK_OPEN, FUNCTION_OPEN))
            pieces += self._content.pieces(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        at, tag = min(starts)
        pieces += self._content.pieces(self._buffer[:at])
        self._buffer = self._buffer[at + len(tag) :]
        self._unopened = tag
        self._state = "block" if tag == BLOCK_OPEN else "name"
        return True

    def _in_block(self, pieces: list[ToolCallPiece]) -> bool:
        rest = self._buffer.lstrip()
        if rest.startswith(FUNCTION_OPEN):
            self._unopened += self._buffer[: len(self._buffer) - len(rest) + len(FUNCTION_OPEN)]
            self._buffer, self._state = rest[len(FUNCTION_OPEN) :], "name"
            return True
        if FUNCTION_OPEN.startswith(rest):
            return False
        return self._not_a_call(pieces)

    def _in_name(self, pieces: list[ToolCallPiece]) -> bool:
        at = self._buffer.find(">")
        if at < 0:
            return _NAME.fullmatch(self._buffer) is None and self._not_a_call(pieces)
        name = self._buffer[:at].strip()
        if not _NAME.fullmatch(self._buffer[:at]) or not name:
            return self._not_a_call(pieces)
        self._buffer = self._buffer[at + 1 :]
        self._function = self._schemas.get(name, {})
        self._num_parameters = 0
        self._state = "parameters"
        pieces.append(ToolCallPiece("call", name, self._num_calls))
        return True

    def _in_parameters(self, pieces: list[ToolCallPiece]) -> bool:
        rest = self._buffer.lstrip()
        if rest.startswith(FUNCTION_CLOSE):
            pieces.append(self._arguments("}" if self._num_parameters else "{}"))
            self._buffer, self._state = rest[len(FUNCTION_CLOSE) :], "after"
            self._num_calls += 1
            return True
        if rest.startswith(PARAMETER_OPEN):
            at = rest.find(">")
            if at < 0:
                return False
            self._parameter = rest[len(PARAMETER_OPEN) : at].strip()
            self._buffer, self._state = rest[at + 1 :], "value"
            return True
        if any(tag.startswith(rest) for tag in (FUNCTION_CLOSE, PARAMETER_OPEN)):
            return False
        at = rest.find("<", 1)  # stray text between parameters is part of no value
        self._buffer = rest[at:] if at > 0 else ""
        return at > 0

    def _in_value(self, pieces: list[ToolCallPiece]) -> bool:
        at = self._buffer.find(PARAMETER_CLOSE)
        if at < 0:
            return False
        value = _typed(
            self._buffer[:at].removeprefix("\n").removesuffix("\n"),
            self._function.get(self._parameter),
        )
        separator = ", " if self._num_parameters else "{"
        pieces.append(
            self._arguments(f"{separator}{json.dumps(self._parameter)}: {json.dumps(value)}")
        )
        self._num_parameters += 1
        self._buffer, self._state = self._buffer[at + len(PARAMETER_CLOSE) :], "parameters"
        return True

    def _after_function(self, pieces: list[ToolCallPiece]) -> bool:
        rest = self._buffer.lstrip()
        if rest.startswith(BLOCK_CLOSE):
            self._buffer, self._state = rest[len(BLOCK_CLOSE) :], "content"
            return True
        if BLOCK_CLOSE.startswith(rest):
            return False
        self._state = "content"
        return True

    def _not_a_call(self, pieces: list[ToolCallPiece]) -> bool:
        pieces += self._content.pieces(self._unopened + self._buffer)
        self._buffer, self._state = "", "content"
        return False

    def _arguments(self, text: str) -> ToolCallPiece:
        return ToolCallPiece("arguments", text, self._num_calls)


def _typed(text: str, schema: dict | None):
    """A parameter's text as its schema's type has it; the text itself where it does not convert."""
    kind = (schema or {}).get("type", "string")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    if "string" in kinds:
        return text
    if "null" in kinds and text.strip() == "null":
        return None
    if "boolean" in kinds and text.strip().lower() in ("true", "false"):
        return text.strip().lower() == "true"
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    numeric = {"integer": int, "number": (int, float)}
    for name, types in numeric.items():
        if name in kinds and isinstance(value, types) and not isinstance(value, bool):
            return value
    if ("object" in kinds and isinstance(value, dict)) or (
        "array" in kinds and isinstance(value, list)
    ):
        return value
    return text


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The Qwen3-Coder parser, for ``name`` ``qwen3_coder``."""
    return Qwen3CoderToolCallParser() if name == "qwen3_coder" else None
