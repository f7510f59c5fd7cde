"""``POST /v1/messages``: Anthropic's Messages API over the same chat machinery (template, tools, constraints).

Messages become chat turns (``system`` first, ``tool_use`` blocks as assistant tool calls,
``tool_result`` blocks as tool turns); ``tool_choice`` ``auto``, ``any``, ``tool`` and ``none`` map to
the chat API's ``auto``, ``required``, a named function and ``none``. Streams send Anthropic's
named events: ``message_start``, a ``content_block_start`` / ``_delta`` / ``_stop`` run per block
(text deltas as they are generated; with tools offered the text is held until the end, as in chat),
``message_delta`` with the stop reason and usage, and ``message_stop``. Errors keep this server's
OpenAI-shaped body.
"""

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.chat import render_messages
from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import DeltaTracker, check_finished, new_id, request_attributes
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import RequestGroup, fan_out, unless_disconnected
from spyglass.core.api.messages_schemas import (
    MessageResponse,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.schemas import ChatMessage, FunctionCall, ToolCall
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.tools import ToolUse, constraint, split_output
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.outputs import CompletionOutput
from spyglass.core.engine.sampling_params import SamplingParams


def chat_messages(body: MessagesRequest) -> list[ChatMessage]:
    """The conversation as chat turns."""
    turns = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "\n".join(block.text for block in body.system)
        turns.append(ChatMessage("system", system))
    for message in body.messages:
        if isinstance(message.content, str):
            turns.append(ChatMessage(message.role, message.content))
            continue
        text = "\n".join(block.text for block in message.content if isinstance(block, TextBlock))
        if message.role == "assistant":
            calls = [
                ToolCall(id=block.id, function=FunctionCall(block.name, json.dumps(block.input)))
                for block in message.content
                if isinstance(block, ToolUseBlock)
            ]
            turns.append(ChatMessage("assistant", text or None, tool_calls=calls or None))
            continue
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                result = block.content if isinstance(block.content, str) else "\n".join(b.text for b in block.content)
                turns.append(ChatMessage("tool", result, tool_call_id=block.tool_use_id))
        if text:
            turns.append(ChatMessage("user", text))
    return turns


def tool_use(body: MessagesRequest) -> ToolUse:
    """The request's tools and choice in the chat API's terms; a 400 for a choice that cannot be met."""
    tools = [
        {"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema}}
        for t in body.tools or []
    ]
    choice = body.tool_choice
    mode = choice.type if choice else ("auto" if tools else "none")
    parallel = not (choice and choice.disable_parallel_tool_use)
    if not tools and mode != "none":
        raise APIError(400, "tool_choice needs tools", "tool_choice")
    if mode == "tool":
        if choice.name not in {t.name for t in body.tools or []}:
            raise APIError(400, f"tool_choice names {choice.name!r}, which is not among the tools", "tool_choice")
        return ToolUse(tools, "forced", choice.name, parallel=False)
    return ToolUse(tools, "required" if mode == "any" else mode, parallel=parallel)


@post(
    "/v1/messages", summary="Create a message (Anthropic Messages API)", tags=["anthropic"], status_code=200,
    guards=[json_body_guard], opt={"body": MessagesRequest},
)
async def create_message(
    data: JSONBody[MessagesRequest], request: Request, serving: NamedDependency[ServingContext]
) -> Response:
    """Anthropic's Messages endpoint; ``stream=true`` answers with its named server-sent events."""
    serving.check_model(data.model)
    serving.admit()
    use = tool_use(data)
    params = SamplingParams(
        temperature=data.temperature, top_p=data.top_p, top_k=data.top_k, max_tokens=data.max_tokens,
        stop=[s for s in data.stop_sequences or [] if s], structured_output=constraint(use),
    )
    response_id = new_id("msg")
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    with serving.queue_slots(1):
        messages, prompt = await asyncio.to_thread(render_messages, chat_messages(data), serving.tokenizer, use)
        attributes["messages"] = messages
        specs = fan_out([(await encode_text(serving, prompt, "messages"), prompt)], params)
        group = RequestGroup(serving.async_engine, response_id, specs, attributes)
        await unless_disconnected(request, group.start())
    writer = _MessageWriter(serving, data, response_id, use)
    if data.stream:
        return event_stream(writer.events(group), named=True)
    return Response(await unless_disconnected(request, writer.collect(group)))


class _MessageWriter:
    """Builds the message, or its stream of events, for one call."""

    def __init__(self, serving: ServingContext, body: MessagesRequest, response_id: str, use: ToolUse):
        self.serving = serving
        self.body = body
        self.id = response_id
        self.use = use

    def _blocks(self, completion: CompletionOutput) -> tuple[str | None, list[ToolUseBlock]]:
        content, calls = split_output(completion.text, self.use, self.serving.tool_parser)
        uses = [
            ToolUseBlock(f"toolu_{uuid.uuid4().hex[:24]}", call.function.name, _input(call.function.arguments))
            for call in calls
        ]
        return content, uses

    async def collect(self, group: RequestGroup) -> MessageResponse:
        """Run to the end and build the message."""
        (output,) = await group.final_outputs()
        completion = output.outputs[0]
        check_finished(completion)
        content, uses = self._blocks(completion)
        blocks = ([TextBlock(content)] if content else []) + uses
        reason, sequence = _stop(completion, uses)
        usage = Usage(len(output.prompt_token_ids), len(completion.token_ids))
        return MessageResponse(id=self.id, model=self.body.model, content=blocks, stop_reason=reason,
                               stop_sequence=sequence, usage=usage)

    async def events(self, group: RequestGroup) -> AsyncIterator[tuple[str, dict]]:
        """Anthropic's event sequence for one message."""
        tracker, output, started, text_open = DeltaTracker(), None, False, False
        async for _, output in group.outputs():
            completion = output.outputs[0]
            check_finished(completion)
            if not started:
                started = True
                yield "message_start", {"type": "message_start", "message": {
                    "id": self.id, "type": "message", "role": "assistant", "model": self.body.model, "content": [],
                    "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": len(output.prompt_token_ids), "output_tokens": 0}}}
            if self.use.active:
                tracker.advance(completion)
                continue
            delta = tracker.advance(completion)
            if delta.text:
                if not text_open:
                    text_open = True
                    yield "content_block_start", _block_start(0, {"type": "text", "text": ""})
                yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": delta.text}}
        completion = output.outputs[0]
        uses: list[ToolUseBlock] = []
        index = 0
        if self.use.active:
            content, uses = self._blocks(completion)
            if content:
                yield "content_block_start", _block_start(0, {"type": "text", "text": ""})
                yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": content}}
                text_open = True
        if text_open:
            yield "content_block_stop", {"type": "content_block_stop", "index": 0}
            index = 1
        for offset, use in enumerate(uses):
            yield "content_block_start", _block_start(index + offset, {"type": "tool_use", "id": use.id,
                                                                       "name": use.name, "input": {}})
            yield "content_block_delta", {"type": "content_block_delta", "index": index + offset,
                                          "delta": {"type": "input_json_delta", "partial_json": json.dumps(use.input)}}
            yield "content_block_stop", {"type": "content_block_stop", "index": index + offset}
        reason, sequence = _stop(completion, uses)
        yield "message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                "usage": {"output_tokens": len(completion.token_ids)}}
        yield "message_stop", {"type": "message_stop"}


def _block_start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _input(arguments: str) -> dict:
    value = json.loads(arguments)
    return value if isinstance(value, dict) else {"value": value}


def _stop(completion: CompletionOutput, uses: list) -> tuple[str | None, str | None]:
    """Anthropic's stop reason and, for a stop string, the string."""
    if uses and completion.finish_reason == "stop":
        return "tool_use", None
    if completion.finish_reason == "length":
        return "max_tokens", None
    if isinstance(completion.stop_reason, str):
        return "stop_sequence", completion.stop_reason
    return "end_turn", None
