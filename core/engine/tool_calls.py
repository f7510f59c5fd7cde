"""Tool calls in generated text: the parser protocol a plugin provides, and the calls it finds."""

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One call the model wrote: the function's name and its arguments as a JSON object string."""

    name: str
    arguments: str


class ToolCallParser(Protocol):
    """Splits a model's output into plain content and tool calls, for one tool-call format."""

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """``(content, calls)``: the text outside the calls (None when there is none) and the calls, in order."""
        ...
