"""A finished chat answer read the way the API reads it: its reasoning, content and tool calls.

The API splits each choice of a chat call (``/v1/chat/completions``, ``/v1/messages``,
``/v1/responses``) with the server's reasoning parser and tool-call format, as the request
asked. It leaves an `AnswerReading` in the request's ``attributes["answer_reading"]`` saying how,
so that a plugin (the tracing plugin's output messages) reads the same answer out of the same
text: `AnswerReading.read`, with the parsers the engine's plugins provide (`ParserLookup`, on
`EngineInfo.parsers`).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spyglass.core.engine.call_streams import answer_calls_stream
from spyglass.core.engine.reasoning import ReasoningParser, split_reasoning
from spyglass.core.engine.tool_calls import (
    ParsedToolCall,
    ToolCallParser,
    ToolCallStream,
    parse_whole,
)

if TYPE_CHECKING:  # read, not imported: the API imports this module without the engine
    from spyglass.core.engine.request import Request
    from spyglass.core.tokenizer import Tokenizer

JSON_CALLS = "json"
"""`AnswerReading.tool_call_parser` for calls a grammar writes as JSON (``tool_choice`` required or named)."""


@dataclass(frozen=True, slots=True)
class ReadAnswer:
    """One answer as the client received it: the model's reasoning, its content and its tool calls."""

    reasoning: str | None
    content: str | None
    tool_calls: tuple[ParsedToolCall, ...] = ()


@dataclass(frozen=True, slots=True)
class ParserLookup:
    """The parsers the engine's plugins provide by name (the hooks ``spyglass_tool_call_parser``
    and ``spyglass_reasoning_parser``)."""

    tool_call_parser: Callable[[str], ToolCallParser | None]
    reasoning_parser: Callable[[str], ReasoningParser | None]


@dataclass(frozen=True, slots=True)
class AnswerReading:
    """How the API reads one request's answer: the reasoning parser that splits off its thought
    (None: it does not), the format its tool calls are read in (a tool-call parser's name,
    `JSON_CALLS`, or None: no calls are read), and whether all its calls count or the first only."""

    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    parallel: bool = True

    def read(self, text: str, parsers: ParserLookup, tools: Sequence[dict] = ()) -> ReadAnswer:
        """``text``'s answer, with the named parsers (``tools``: the request's offered tools,
        for formats that read calls by their schemas). A parser no plugin provides reads nothing."""
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning = parsers.reasoning_parser(self.reasoning_parser)
        calls = None
        if self.tool_call_parser == JSON_CALLS:
            calls = answer_calls_stream(None, self.parallel, tools)
        elif self.tool_call_parser is not None:
            parser = parsers.tool_call_parser(self.tool_call_parser)
            if parser is not None:
                calls = answer_calls_stream(parser, self.parallel, tools)
        return read_answer(text, reasoning, calls)


def read_request_answer(
    request: "Request", text: str, parsers: ParserLookup | None
) -> ReadAnswer | None:
    """The answer the API read out of ``text`` (the finished request's `answer_text`), by the
    `AnswerReading` it left on the request; None for a request it does not split, or without
    ``parsers`` (`EngineInfo.parsers`)."""
    reading = request.attributes.get("answer_reading")
    if not isinstance(reading, AnswerReading) or parsers is None:
        return None
    return reading.read(text, parsers, request.attributes.get("tools") or ())


def read_answer(
    text: str, reasoning: ReasoningParser | None, calls: ToolCallStream | None
) -> ReadAnswer:
    """A whole answer's reasoning (split off by ``reasoning``), then its content and tool calls
    (read by ``calls``, a fresh stream; None: it is all content): what its stream assembles to."""
    thought = None
    if reasoning is not None:
        thought, text = split_reasoning(reasoning, text)
        if text is None:  # all of it was reasoning
            return ReadAnswer(thought, None)
    if calls is None:
        return ReadAnswer(thought, text)
    content, found = parse_whole(calls, text)
    return ReadAnswer(thought, content, tuple(found))


def answer_text(request: "Request", tokenizer: "Tokenizer") -> str:
    """A finished request's output text as the API returned it: decoded as the request asked
    (special tokens' text kept or not), without the stop token or stop string that ended it
    unless ``include_stop_str_in_output`` keeps them."""
    params = request.sampling_params
    ids = request.output_token_ids
    keep_stop = params.include_stop_str_in_output
    if (
        ids
        and not keep_stop
        and (ids[-1] in request.eos_token_ids or ids[-1] in params.stop_token_ids)
    ):
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)
    if isinstance(request.stop_reason, str) and not keep_stop:
        cut = text.find(request.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text
