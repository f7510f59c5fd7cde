"""The Hermes tool-call format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call.

Qwen2.5's chat template and SmolLM2's tool-use training data write calls this way, and the HTTP
API's fallback tool prompt asks models without a tool template for it. A block that is not such a
JSON object stays in the content: what cannot be parsed is shown, never dropped.
"""

import json
import re

from spyglass.core.plugin_api import ParsedToolCall, ToolCallParser, hookimpl

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


class HermesToolCallParser:
    """Finds ``<tool_call>`` blocks (an unterminated last one too, as a length cut leaves it)."""

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        calls, kept, position = [], [], 0
        for match in _BLOCK.finditer(text):
            call = _call(match[1])
            if call is None:
                continue
            kept.append(text[position : match.start()])
            position = match.end()
            calls.append(call)
        kept.append(text[position:])
        content = "".join(kept).strip()
        return content or None, calls


def _call(block: str) -> ParsedToolCall | None:
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    return ParsedToolCall(value["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


@hookimpl
def spyglass_tool_call_parser(name: str) -> ToolCallParser | None:
    """The Hermes parser, for ``name`` ``hermes``."""
    return HermesToolCallParser() if name == "hermes" else None
