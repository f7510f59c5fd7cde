"""Reasoning in generated text: the parser protocol a plugin provides and the pieces it streams.

Reasoning models (DeepSeek-R1, Qwen3, ...) write their thinking before the answer, between
``<think>`` and ``</think>``. A reasoning parser splits an output into the reasoning and the content
that follows; the API returns them apart (vLLM's ``reasoning_content``), and only the content goes
on to the tool-call parser. A whole answer is its stream's pieces collected.
"""

from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True, slots=True)
class ReasoningPiece:
    """A piece of an output: ``reasoning`` text or ``content`` text."""

    kind: Literal["reasoning", "content"]
    text: str


class ReasoningStream(Protocol):
    """One output's incremental split: feed text as it is generated, then finish."""

    def feed(self, text: str) -> list[ReasoningPiece]:
        """The pieces ``text`` (the next part of the output) completes; what may still be part of
        a tag is held back."""
        ...

    def finish(self) -> list[ReasoningPiece]:
        """The output ended: the pieces still held."""
        ...


class ReasoningParser(Protocol):
    """Splits outputs of one reasoning format into reasoning and content.

    Optional: ``reads_special_tokens = True`` for a format whose tags are special tokens
    (Magistral's ``[THINK]``): answers it splits keep special tokens' text, as the tags would
    otherwise not be in the text.
    """

    def stream(self) -> ReasoningStream:
        """A fresh incremental split of one output."""
        ...

    def reasoning_rules(self, budget: int | None = None, required: bool = False) -> str | None:
        """Grammar rules (llguidance's Lark dialect) defining ``reasoning``: the thought an answer
        opens with (at most ``budget`` tokens when given; optional unless ``required`` where the
        format reasons only when the answer opens it) up to and including its closing tag.
        Optional (None too): with them a constrained answer (a JSON schema, ``tool_choice``
        required) reasons first and the constraint holds after (`StructuredOutput.after_reasoning`),
        and a thinking budget holds (with `budget_grammar` for unconstrained answers); without
        them constrained answers do not reason and a budget is a 400."""
        ...

    def budget_grammar(self, budget: int, required: bool = False) -> str | None:
        """A grammar (the same dialect) of whole answers that reason at most ``budget`` tokens
        (and must, if ``required``), then say anything. Optional (None too), as `reasoning_rules`."""
        ...


def split_reasoning(parser: ReasoningParser, text: str) -> tuple[str | None, str | None]:
    """``(reasoning, content)`` of a whole output (None for a part that is empty): its stream's
    pieces collected, so that a streamed answer assembles to the same."""
    stream = parser.stream()
    pieces = stream.feed(text) + stream.finish()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    return reasoning or None, content or None
