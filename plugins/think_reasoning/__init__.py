"""Reasoning between tags: the ``deepseek_r1``, ``qwen3`` (``<think>``) and ``mistral`` (``[THINK]``) formats.

``deepseek_r1``: DeepSeek-R1's template opens ``<think>`` in the prompt, so the output starts in
the reasoning (a ``<think>`` the model writes itself is dropped) and everything before
``</think>`` is reasoning; an output cut before ``</think>`` is all reasoning. ``qwen3``: the output
reasons only when it starts with ``<think>`` (Qwen3 with thinking on); otherwise, as with
``enable_thinking: false`` in ``chat_template_kwargs``, all of it is content. In both, the
whitespace the model writes at the start of its reasoning and between ``</think>`` and the answer is
dropped. ``mistral``: as ``qwen3`` with Magistral's ``[THINK]`` and ``[/THINK]`` (Magistral Small
1.1 and later), which are special tokens: answers it splits keep special tokens' text
(`ThinkFormat.reads_special_tokens`).

`ThinkFormat.reasoning_rules` gives the reasoning as grammar rules (``<think>`` formats only), so
that a constrained answer (a JSON schema, say) may reason first, and a thinking budget (Anthropic's
``budget_tokens``) closes the reasoning after that many tokens at the latest.

The plugin holds no state: its entry point registers the module, as the Hermes tool parser's does.
"""

import json
from dataclasses import dataclass

from spyglass.core.plugin_api import ReasoningPiece, hookimpl, split_at_tag


@dataclass(frozen=True, slots=True)
class ThinkFormat:
    """A format of reasoning between an ``open_tag`` and a ``close_tag``: whether the output starts
    inside the reasoning without writing ``open_tag``, and whether the tags are special tokens."""

    starts_in_reasoning: bool
    open_tag: str = "<think>"
    close_tag: str = "</think>"
    reads_special_tokens: bool = False

    def stream(self) -> "ThinkStream":
        """A fresh incremental split."""
        return ThinkStream(self)

    def reasoning_rules(self, budget: int | None = None, required: bool = False) -> str | None:
        """Lark rules (llguidance's) of the reasoning an answer may open with: ``reasoning`` is
        the thought (at most ``budget`` tokens when given) and its closing tag, optional unless
        ``required`` where the format reasons only when the answer opens the tag. None for tags
        that are special tokens, which a grammar of text cannot write.

        The thought may hold anything but the closing tag. Its lexeme is greedy, so it could
        swallow the tag's start before the tag's last character shows it closes: a second lexeme,
        the thought ending with all of the tag but its last character, lets the parser take that
        reading when the last character comes. A budget ends the thought where it is, and the tag
        follows."""
        if self.reads_special_tokens:
            return None
        close = self.close_tag
        limit = "" if budget is None else f"[max_tokens={budget}]"
        thought = "reasoning_thought SPACE"
        if self.starts_in_reasoning:
            reasoning = f"reasoning: {thought}"
        else:
            opened = f"{json.dumps(self.open_tag)} {thought}"
            reasoning = f"reasoning: {opened}" if required else f"reasoning: ({opened})?"
        never_closed = f"~/(?s:.*){_pattern(close)}(?s:.*)/"
        return "\n".join(
            [
                reasoning,
                f"reasoning_thought: thought_text {json.dumps(close)} "
                f"| thought_closing {json.dumps(close[-1])}",
                f"thought_text{limit}: THOUGHT_TEXT",
                f"thought_closing{limit}: THOUGHT_CLOSING",
                f"THOUGHT_TEXT: /(?s:.*)/ & {never_closed}",
                f"THOUGHT_CLOSING: /(?s:.*){_pattern(close[:-1])}/ & {never_closed}",
                r"SPACE: /[ \t\n]{0,4}/",  # what models write after the thought; never a run
            ]
        )

    def budget_grammar(self, budget: int, required: bool = False) -> str | None:
        """A grammar of whole answers that reason at most ``budget`` tokens (and must, if
        ``required``), then say anything; where the answer opens the thought, what follows an
        answer that did not open it never opens it either (else a thought could run unbounded
        as answer text). None where `reasoning_rules` is."""
        rules = self.reasoning_rules(budget, required)
        if rules is None:
            return None
        rest = "REST: /(?s:.*)/"
        if not (self.starts_in_reasoning or required):
            rest += f" & ~/{_pattern(self.open_tag)}(?s:.*)/"
        return "\n".join(["start: reasoning REST", rules, rest])


class ThinkStream:
    """Splits one output as it grows: the opening (whitespace, then ``<think>`` or not), the
    reasoning up to ``</think>``, then content; whitespace at the start of either is dropped."""

    def __init__(self, think: ThinkFormat):
        self._think = think
        self._starts_in_reasoning = think.starts_in_reasoning
        self._state = "opening"
        self._buffer = ""

    def feed(self, text: str) -> list[ReasoningPiece]:
        """The pieces ``text`` completes."""
        self._buffer += text
        pieces: list[ReasoningPiece] = []
        if self._state == "opening":
            self._open()
        if self._state == "reasoning_start":
            self._buffer = self._buffer.lstrip()
            if self._buffer:
                self._state = "reasoning"
        if self._state == "reasoning":
            split = split_at_tag(self._buffer, self._think.close_tag)
            pieces.append(ReasoningPiece("reasoning", split.before))
            self._buffer = split.after
            if split.found:
                self._state = "after"
        if self._state == "after":
            self._buffer = self._buffer.lstrip()
            if self._buffer:
                self._state = "content"
        if self._state == "content":
            pieces.append(ReasoningPiece("content", self._buffer))
            self._buffer = ""
        return [p for p in pieces if p.text]

    def _open(self) -> None:
        """Leave the opening once it is known whether the output reasons."""
        stripped, tag = self._buffer.lstrip(), self._think.open_tag
        if stripped.startswith(tag):
            self._buffer = stripped[len(tag) :]
            self._state = "reasoning_start"
        elif tag.startswith(stripped):
            return  # only whitespace, or a start of <think>, so far
        elif self._starts_in_reasoning:
            self._buffer = stripped
            self._state = "reasoning_start"
        else:
            self._state = "content"

    def finish(self) -> list[ReasoningPiece]:
        """What is held: a partial tag is text after all."""
        if self._state == "opening":
            self._state = "reasoning" if self._starts_in_reasoning else "content"
            if self._starts_in_reasoning:
                self._buffer = self._buffer.lstrip()
        kind = "reasoning" if self._state in ("reasoning", "reasoning_start") else "content"
        text, self._buffer = self._buffer, ""
        return [ReasoningPiece(kind, text)] if text and self._state != "after" else []


def _pattern(text: str) -> str:
    """``text`` as a regular expression inside llguidance's ``/.../``."""
    return "".join(f"\\{c}" if c in "/\\.^$*+?()[]{}|" else c for c in text)


FORMATS = {
    "deepseek_r1": ThinkFormat(starts_in_reasoning=True),
    "qwen3": ThinkFormat(starts_in_reasoning=False),
    "mistral": ThinkFormat(False, "[THINK]", "[/THINK]", reads_special_tokens=True),
}


@hookimpl
def spyglass_reasoning_parser(name: str) -> ThinkFormat | None:
    """The ``deepseek_r1``, ``qwen3`` or ``mistral`` format."""
    return FORMATS.get(name)
