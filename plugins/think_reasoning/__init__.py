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

A thinking budget (Anthropic's ``budget_tokens``) holds through `ThinkFormat.budget_grammar`: the
answer's reasoning is closed after that many tokens at the latest (``<think>`` formats only).

The plugin holds no state: its entry point registers the module, as the Hermes tool parser's does.
"""

import json
from dataclasses import dataclass

from spyglass.core.plugin_api import ReasoningPiece, hookimpl, partial_suffix


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

    def budget_grammar(self, budget: int) -> str | None:
        """A grammar (llguidance's Lark) of answers that think at most ``budget`` tokens: the
        reasoning (opened by the answer unless the format starts in it) ends with the closing tag
        by then at the latest, any text follows. None for tags that are special tokens, which a
        grammar of text cannot force."""
        if self.reads_special_tokens:
            return None
        close = json.dumps(self.close_tag)
        pattern = "".join(f"\\{c}" if c in "/\\.^$*+?()[]{}|" else c for c in self.close_tag)
        opening = "" if self.starts_in_reasoning else f"{json.dumps(self.open_tag)} "
        return "\n".join(
            [
                f"start: {opening}thought {close} REST",
                f"thought[max_tokens={budget}]: THOUGHT",
                f"THOUGHT: /(?s:.*)/ & ~/(?s:.*){pattern}(?s:.*)/",
                "REST: /(?s:.*)/",
            ]
        )


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
            close = self._think.close_tag
            at = self._buffer.find(close)
            if at < 0:
                keep = partial_suffix(self._buffer, close)
                pieces.append(ReasoningPiece("reasoning", self._buffer[: len(self._buffer) - keep]))
                self._buffer = self._buffer[len(self._buffer) - keep :]
            else:
                pieces.append(ReasoningPiece("reasoning", self._buffer[:at]))
                self._buffer = self._buffer[at + len(close) :]
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


FORMATS = {
    "deepseek_r1": ThinkFormat(starts_in_reasoning=True),
    "qwen3": ThinkFormat(starts_in_reasoning=False),
    "mistral": ThinkFormat(False, "[THINK]", "[/THINK]", reads_special_tokens=True),
}


@hookimpl
def spyglass_reasoning_parser(name: str) -> ThinkFormat | None:
    """The ``deepseek_r1``, ``qwen3`` or ``mistral`` format."""
    return FORMATS.get(name)
