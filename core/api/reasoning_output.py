"""One choice's output split into the model's reasoning, its content and its tool calls.

The reasoning parser (``--reasoning-parser``) sees the output first; only the content after the
reasoning goes on to the tool-call parser. A request whose output is constrained (a response
format, ``tool_choice`` required or named) reasons first where the reasoning format gives its
grammar rules: the constraint holds from the end of the reasoning on, as vLLM applies structured
outputs. A grammar of the client's (or a strict tool format's) leaves no room for reasoning: such
answers are not split.
"""

import dataclasses

from spyglass.core.api.errors import APIError
from spyglass.core.api.schemas import ToolCall
from spyglass.core.api.tools import (
    OutputSplitter,
    ToolFormat,
    ToolUse,
    count_calls,
    response_tool_call,
    tool_stream,
)
from spyglass.core.engine.answer_reading import JSON_CALLS, AnswerReading, read_answer
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.reasoning import ReasoningParser, ReasoningPiece
from spyglass.core.engine.sampling_params import (
    FREE_TEXT_KINDS,
    SamplingParams,
    StructuredOutput,
)
from spyglass.core.engine.tool_calls import ToolCallParser, ToolCallPiece


def reasoning_for(
    parser: ReasoningParser | None, params: SamplingParams, use: ToolUse
) -> ReasoningParser | None:
    """The reasoning parser a request's output goes through: None when its output is constrained
    from its first token (a grammar of the client's, or a format without `reasoning_rules`).
    Structural tags allow any text but their structures, a thought's too: it is split."""
    spec = params.structured_output
    if use.mode in ("required", "forced") and spec is None:
        spec = StructuredOutput("json_schema", {})  # the calls' schema: any like it will do
    if spec is None or spec.kind == "structural_tag":
        return parser
    if held_after_reasoning(parser, spec).after_reasoning is None:
        return None
    return parser


def held_after_reasoning(
    parser: ReasoningParser | None, spec: StructuredOutput | None
) -> StructuredOutput | None:
    """``spec`` held only once the answer's reasoning is over, where the reasoning format gives
    its rules (`ReasoningParser.reasoning_rules`) and ``spec`` is not a grammar of its own; else
    ``spec`` as it is."""
    if spec is None or spec.kind in FREE_TEXT_KINDS or spec.after_reasoning is not None:
        return spec
    rules_of = getattr(parser, "reasoning_rules", None)
    rules = rules_of() if rules_of is not None else None
    return spec if rules is None else dataclasses.replace(spec, after_reasoning=rules)


def reads_special_tokens(
    reasoning: ReasoningParser | None,
    tool_parser: ToolCallParser | None,
    params: SamplingParams,
    use: ToolUse,
) -> bool:
    """Whether a request's answer must keep special tokens' text for a parser to read it: the
    reasoning parser's or (with ``tool_choice`` auto) the tool-call parser's markers are special
    tokens (Magistral's ``[THINK]``, Mistral's ``[TOOL_CALLS]``)."""
    parsers = (reasoning_for(reasoning, params, use), tool_parser if use.mode == "auto" else None)
    return any(getattr(parser, "reads_special_tokens", False) for parser in parsers)


def thinking_constraint(
    parser: ReasoningParser | None,
    spec: StructuredOutput | None,
    budget: int,
    required: bool,
    param: str,
) -> StructuredOutput:
    """A thinking budget as the answer's constraint: at most ``budget`` tokens of thought (one
    required if ``required``), then ``spec``'s answer, or any text without one. A 400 naming
    ``param`` where it cannot hold: no reasoning parser, a format whose tags a grammar cannot
    write, or a grammar of the client's, which names its own start."""
    rules_of = getattr(parser, "reasoning_rules", None)
    rules = rules_of(budget, required) if rules_of is not None else None
    if rules is None:
        raise APIError(
            400,
            "a thinking budget needs a server started with a --reasoning-parser whose tags a "
            "grammar can hold (qwen3 or deepseek_r1)",
            param,
        )
    if spec is None:
        return StructuredOutput("grammar", parser.budget_grammar(budget, required))
    if (
        spec.kind in FREE_TEXT_KINDS
    ):  # a grammar names its own start; tags hold from the first token
        raise APIError(400, f"a thinking budget cannot precede a {spec.kind}", param)
    return dataclasses.replace(spec, after_reasoning=rules)


def answer_reading(
    reasoning: ReasoningParser | None,
    reasoning_name: str | None,
    use: ToolUse,
    tool_format: ToolFormat,
) -> AnswerReading | None:
    """How the API reads a request's answer (for plugins: `AnswerReading`), given the reasoning
    parser it goes through (`reasoning_for`) and that parser's name: None for plain text."""
    calls = None
    if use.mode in ("required", "forced"):
        calls = JSON_CALLS
    elif use.mode == "auto" and tool_format.parser is not None:
        calls = tool_format.name
    thought = reasoning_name if reasoning is not None else None
    if calls is None and thought is None:
        return None
    return AnswerReading(thought, calls, use.parallel)


def split_choice(
    text: str, reasoning: ReasoningParser | None, use: ToolUse, tool_format: ToolFormat
) -> tuple[str | None, str | None, list[ToolCall]]:
    """``(reasoning, content, tool_calls)`` of a whole output: what its stream assembles to (its
    calls counted in ``spyglass:tool_calls``)."""
    answer = read_answer(text, reasoning, tool_stream(use, tool_format))
    count_calls(use, tool_format, len(answer.tool_calls))
    return answer.reasoning, answer.content, [response_tool_call(c) for c in answer.tool_calls]


class ChoiceSplitter:
    """Turns one choice's delta outputs into reasoning pieces, then content and tool-call pieces,
    and counts the reasoning's tokens: those of the outputs before the first one that adds to the
    answer (the tokens of ``</think>`` and the whitespace after it included), once the choice has
    reasoned at all."""

    def __init__(self, reasoning: ReasoningParser | None, use: ToolUse, tool_format: ToolFormat):
        self.reasoning = reasoning.stream() if reasoning is not None else None
        self.tools = OutputSplitter(use, tool_format)
        self._answered = False
        self._reasoned = False
        self._tokens_before_answer = 0

    @property
    def reasoning_tokens(self) -> int:
        """The tokens spent reasoning so far (0 for a choice that did not reason)."""
        return self._tokens_before_answer if self._reasoned else 0

    @property
    def num_calls(self) -> int:
        """Tool calls started so far."""
        return self.tools.num_calls

    def advance(self, output: RequestOutput) -> list[ReasoningPiece | ToolCallPiece]:
        """The pieces of a delta output (and all that is left once it finished)."""
        pieces = self.feed(output.outputs[0].text, output.finished)
        if not self._answered:
            self._tokens_before_answer += len(output.outputs[0].token_ids)
        return pieces

    def feed(self, text: str, finished: bool = False) -> list[ReasoningPiece | ToolCallPiece]:
        """The pieces of the output's next ``text`` (and all that is left when ``finished``)."""
        pieces = self._split(text, finished)
        self._reasoned = self._reasoned or any(p.kind == "reasoning" for p in pieces)
        self._answered = self._answered or any(p.kind != "reasoning" for p in pieces)
        return pieces

    def _split(self, text: str, finished: bool) -> list[ReasoningPiece | ToolCallPiece]:
        if self.reasoning is None:
            return list(self.tools.feed(text, finished))
        parts = self.reasoning.feed(text) + (self.reasoning.finish() if finished else [])
        thought = "".join(p.text for p in parts if p.kind == "reasoning")
        content = "".join(p.text for p in parts if p.kind == "content")
        pieces: list[ReasoningPiece | ToolCallPiece] = []
        if thought:
            pieces.append(ReasoningPiece("reasoning", thought))
        return pieces + self.tools.feed(content, finished)
