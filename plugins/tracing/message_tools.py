"""The tool traffic of a chat's input messages on its LLM span (content capture on): the calls
earlier assistant turns made and the results tool turns sent back, so an agent's trace shows
which call each result answers.

OpenInference's ``llm.input_messages.{i}.message.tool_calls.{j}.tool_call.*`` and
``message.tool_call_id``; GenAI's ``tool_call`` and ``tool_call_response`` parts. The messages are
the API's (OpenAI's shape: ``tool_calls`` entries with ``id`` and ``function``, a tool turn's
``tool_call_id``), arguments as objects.
"""

import json


def tool_message_attributes(index: int, message: dict) -> dict:
    """OpenInference's tool attributes of input message ``index``."""
    prefix = f"llm.input_messages.{index}.message"
    attrs = {}
    if message.get("tool_call_id") is not None:
        attrs[f"{prefix}.tool_call_id"] = str(message["tool_call_id"])
    for j, call in enumerate(message.get("tool_calls") or ()):
        key = f"{prefix}.tool_calls.{j}.tool_call"
        function = call.get("function") or {}
        if call.get("id") is not None:
            attrs[f"{key}.id"] = str(call["id"])
        attrs[f"{key}.function.name"] = str(function.get("name", ""))
        attrs[f"{key}.function.arguments"] = _arguments_text(function.get("arguments"))
    return attrs


def genai_parts(message: dict, text: str) -> list[dict]:
    """GenAI's parts of an input message whose text is ``text``: a tool turn's result as a
    ``tool_call_response``; else the text (unless empty beside calls), then the calls."""
    if message.get("tool_call_id") is not None:
        return [{"type": "tool_call_response", "id": message["tool_call_id"], "response": text}]
    calls = message.get("tool_calls") or ()
    parts = [{"type": "text", "content": text}] if text or not calls else []
    for call in calls:
        function = call.get("function") or {}
        parts.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments"),
            }
        )
    return parts


def _arguments_text(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
