"""Tool calling for chat: tools into the prompt, ``tool_choice`` into a constraint, generated text into calls.

- ``tool_choice`` ``none`` (or no tools): the tools are left out of the prompt; plain text comes back.
- ``auto``: the tools go into the prompt; the model's text is split into content and calls by the
  tool-call parser plugin (``hermes`` by default).
- ``required`` or a named function: the output is constrained to a JSON call (a list of them when
  ``parallel_tool_calls``), whose ``arguments`` obey the function's parameter schema, so it always
  parses and validates.

Models whose chat template renders ``tools`` get them through the template; for the others (the
default model's template has none) a system-prompt section in the Hermes format (Qwen2.5's) lists
the tools, earlier calls are written as ``<tool_call>`` blocks and tool results as
``<tool_response>`` blocks in a user turn.
"""

import json
import uuid
from dataclasses import dataclass

from spyglass.core.api.errors import APIError
from spyglass.core.api.schemas import ChatCompletionRequest, FunctionCall, ToolCall
from spyglass.core.engine.sampling_params import StructuredOutput
from spyglass.core.engine.tool_calls import ParsedToolCall, ToolCallParser

_ANY_OBJECT = {"type": "object"}
_FALLBACK_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True, slots=True)
class ToolUse:
    """How one chat request uses tools: the definitions (HF's format) and the mode (none, auto, required, forced)."""

    tools: list[dict]
    mode: str
    forced: str | None = None
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether tools are offered at all."""
        return self.mode != "none"


def tool_use(body: ChatCompletionRequest) -> ToolUse:
    """The request's tool use; a 400 for a choice that names no offered function or asks for calls without tools."""
    tools = [{"type": "function", "function": _function_dict(t.function)} for t in body.tools or []]
    choice = body.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools and choice != "none":
        raise APIError(400, "tool_choice needs tools", "tool_choice")
    if isinstance(choice, str):
        return ToolUse(tools, choice, parallel=body.parallel_tool_calls)
    names = [tool["function"]["name"] for tool in tools]
    if choice.function.name not in names:
        raise APIError(400, f"tool_choice names {choice.function.name!r}, which is not among the tools", "tool_choice")
    return ToolUse(tools, "forced", choice.function.name, parallel=False)


def _function_dict(function) -> dict:
    described = {"name": function.name, "parameters": function.parameters or _ANY_OBJECT}
    if function.description:
        described["description"] = function.description
    return described


def constraint(use: ToolUse) -> StructuredOutput | None:
    """The JSON schema the output must follow for ``required`` and forced choices; None otherwise."""
    if use.mode not in ("required", "forced"):
        return None
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in (tool["function"] for tool in use.tools)
        if use.mode == "required" or f["name"] == use.forced
    ]
    one_call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {"type": "array", "items": one_call, "minItems": 1} if use.parallel else one_call
    return StructuredOutput("json_schema", schema)


def prompt_messages(messages: list[dict], use: ToolUse, template_takes_tools: bool) -> list[dict]:
    """``messages`` as the chat template should see them: tool turns written out where the template cannot."""
    if template_takes_tools:
        return messages
    written = []
    for message in messages:
        if message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if written and written[-1]["role"] == "user" and written[-1].get("tool_results"):
                written[-1] = {**written[-1], "content": written[-1]["content"] + "\n" + block}
            else:
                written.append({"role": "user", "content": block, "tool_results": True})
        elif message.get("tool_calls"):
            calls = "\n".join(
                f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n"
                "</tool_call>"
                for c in message["tool_calls"]
            )
            written.append({"role": "assistant", "content": "\n".join(filter(None, [message["content"], calls]))})
        else:
            written.append(message)
    written = [{k: v for k, v in m.items() if k != "tool_results"} for m in written]
    if not use.active:
        return written
    section = _FALLBACK_PROMPT.format(tools="\n".join(json.dumps(tool) for tool in use.tools))
    if written and written[0]["role"] == "system":
        return [{"role": "system", "content": f"{written[0]['content']}\n\n{section}"}, *written[1:]]
    return [{"role": "system", "content": section}, *written]


def split_output(text: str, use: ToolUse, parser: ToolCallParser | None) -> tuple[str | None, list[ToolCall]]:
    """The response's ``content`` and ``tool_calls`` for one generated text."""
    if use.mode in ("required", "forced"):
        try:
            value = json.loads(text)  # the grammar guarantees a whole JSON value unless max_tokens cut it
        except json.JSONDecodeError:
            return text, []
        calls = [ParsedToolCall(c["name"], json.dumps(c["arguments"])) for c in (value if use.parallel else [value])]
        return None, [_tool_call(call) for call in calls]
    if use.mode == "auto" and parser is not None:
        content, calls = parser.parse(text)
        return content, [_tool_call(call) for call in calls]
    return text, []


def _tool_call(call: ParsedToolCall) -> ToolCall:
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(call.name, call.arguments))
