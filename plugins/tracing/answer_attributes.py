"""A chat answer's reasoning, content and tool calls on its spans, as the client received them.

The API leaves an `AnswerReading` on chat requests whose answers it splits (tools offered, or a
reasoning parser); the tracing plugin reads the finished answer the same way
(`read_request_answer`), so a
trace shows the calls the model made, not only the text they were written in:

- always: ``spyglass.response.num_tool_calls`` and ``spyglass.response.tool_names``, the offered
  functions called (names the request's tool definitions hold: the application's, not the
  user's; a name outside them is counted, not recorded);
- with content capture: OpenInference's ``llm.output_messages.0.message.tool_calls.{j}.tool_call.*``
  and GenAI's ``gen_ai.output.messages`` parts (``reasoning``, ``text``, ``tool_call``) on the LLM
  span, and the answer as the assistant message (JSON) for the HTTP span's ``output.value``.
"""

import json

from spyglass.core.plugin_api import FinishReason, ReadAnswer, Request


def answer_attributes(request: Request, answer: ReadAnswer) -> dict:
    """The tool calls' count and the offered functions they called (recorded without opt-in)."""
    if not answer.tool_calls:
        return {}
    offered = {
        tool.get("function", {}).get("name") for tool in request.attributes.get("tools") or ()
    }
    names = [call.name for call in answer.tool_calls if call.name in offered]
    attrs = {"spyglass.response.num_tool_calls": len(answer.tool_calls)}
    if names:
        attrs["spyglass.response.tool_names"] = names
    return attrs


def answer_content_attributes(answer: ReadAnswer, reason: FinishReason) -> dict:
    """The answer's messages (content capture on): OpenInference's and GenAI's."""
    attrs = {
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": answer.content or "",
    }
    for j, call in enumerate(answer.tool_calls):
        prefix = f"llm.output_messages.0.message.tool_calls.{j}.tool_call.function"
        attrs[f"{prefix}.name"] = call.name
        attrs[f"{prefix}.arguments"] = call.arguments
    parts = []
    if answer.reasoning:
        parts.append({"type": "reasoning", "content": answer.reasoning})
    if answer.content:
        parts.append({"type": "text", "content": answer.content})
    parts += [
        {"type": "tool_call", "name": call.name, "arguments": _json_or_text(call.arguments)}
        for call in answer.tool_calls
    ]
    finish = reason.value
    if answer.tool_calls and reason is FinishReason.STOP:
        finish = "tool_call"  # GenAI's finish reason for an answer that calls tools
    message = {"role": "assistant", "parts": parts, "finish_reason": finish}
    attrs["gen_ai.output.messages"] = json.dumps([message])
    return attrs


def answer_message(answer: ReadAnswer) -> str:
    """The answer as OpenAI's assistant message (JSON): the response's choice, for the HTTP span."""
    message: dict = {"role": "assistant", "content": answer.content}
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in answer.tool_calls
        ]
    return json.dumps(message)


def _json_or_text(arguments: str):
    """A call's arguments as the JSON value they spell (GenAI's parts hold values), else the text."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments
