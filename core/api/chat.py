"""``POST /v1/chat/completions``: the model's chat template over the messages, streamed or not."""

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator

import jinja2
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import (
    DeltaTracker,
    chat_logprobs,
    check_finished,
    make_usage,
    new_id,
    request_attributes,
    sampling_params,
)
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import RequestGroup, fan_out, unless_disconnected
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessage,
    FunctionCallDelta,
    ToolCallDelta,
)
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.tools import ToolUse, constraint, prompt_messages, split_output, tool_use
from spyglass.core.api.validation import json_body_guard
from spyglass.core.tokenizer import Tokenizer

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_NO_TOOLS = ToolUse([], "none")


def render_messages(
    messages: list[ChatMessage], tokenizer: Tokenizer, use: ToolUse = _NO_TOOLS
) -> tuple[list[dict], str]:
    """Plain message dicts (HF's shape, tool calls and results included) and the prompt the chat template makes."""
    if not messages:
        raise APIError(400, "messages must not be empty", "messages")
    plain = [_plain(message) for message in messages]
    takes_tools = tokenizer.template_takes_tools
    try:
        prompt = tokenizer.apply_chat_template(
            prompt_messages(plain, use, takes_tools), add_generation_prompt=True,
            tools=use.tools if use.active and takes_tools else None,
        )
    except (ValueError, jinja2.TemplateError) as error:
        raise APIError(400, f"cannot apply the chat template: {error}", "messages") from error
    return plain, prompt


def _plain(message: ChatMessage) -> dict:
    # Roles and part types are checked by the schema; developer messages are system messages here.
    content = message.content
    if isinstance(content, list):
        content = "\n".join(part.text for part in content)
    plain = {"role": _ROLES[message.role], "content": content or ""}
    if message.role == "tool":
        plain["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        plain["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)}}
            for call in message.tool_calls
        ]
    return plain


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise APIError(400, "a tool call's arguments must be a JSON object in a string", "messages")
    return value


@post(
    "/v1/chat/completions", summary="Create a chat completion", tags=["openai"], status_code=200,
    guards=[json_body_guard], opt={"body": ChatCompletionRequest},
)
async def create_chat_completion(
    data: JSONBody[ChatCompletionRequest], request: Request, serving: NamedDependency[ServingContext]
) -> Response:
    """OpenAI's chat completions endpoint; ``stream=true`` answers with server-sent events."""
    serving.check_model(data.model)
    serving.admit()
    max_tokens = data.max_completion_tokens if data.max_completion_tokens is not None else data.max_tokens
    if data.top_logprobs is not None and not data.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    params = sampling_params(data, max_tokens, (data.top_logprobs or 0) if data.logprobs else None)
    use = tool_use(data)
    if (tool_constraint := constraint(use)) is not None:
        if params.structured_output is not None:
            raise APIError(400, "tool_choice required or named cannot be combined with another output constraint",
                           "tool_choice")
        params = dataclasses.replace(params, structured_output=tool_constraint)
    response_id = new_id("chatcmpl")
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    with serving.queue_slots(data.n):
        # Rendering and tokenizing a large conversation take a while: off the event loop, like tokenizing.
        messages, prompt = await asyncio.to_thread(render_messages, data.messages, serving.tokenizer, use)
        attributes["messages"] = messages
        specs = fan_out([(await encode_text(serving, prompt, "messages"), prompt)], params)
        group = RequestGroup(serving.async_engine, response_id, specs, attributes)
        await unless_disconnected(request, group.start())
    writer = _ChatWriter(serving, data, response_id, use)
    if data.stream:
        return event_stream(writer.chunks(group))
    return Response(await unless_disconnected(request, writer.collect(group)))


class _ChatWriter:
    """Builds the response or the stream of chunks for one chat call."""

    def __init__(self, serving: ServingContext, body: ChatCompletionRequest, response_id: str, use: ToolUse):
        self.serving = serving
        self.body = body
        self.use = use
        self.id = response_id
        self.created = int(time.time())

    def _chunk(self, choices: list[ChatChunkChoice], usage=None) -> ChatCompletionChunk:
        return ChatCompletionChunk(self.id, self.created, self.serving.model_name, choices, usage=usage)

    async def collect(self, group: RequestGroup) -> ChatCompletionResponse:
        """Run every choice to the end and build the full response."""
        ordered = await group.final_outputs()
        choices = []
        for index, output in enumerate(ordered):
            completion = output.outputs[0]
            check_finished(completion)
            logprobs = chat_logprobs(self.serving.tokenizer, completion.logprobs or []) if self.body.logprobs else None
            content, calls = split_output(completion.text, self.use, self.serving.tool_parser)
            message = AssistantMessage(content, tool_calls=calls)
            choices.append(ChatChoice(index, message, logprobs, _finish_reason(completion, calls), completion.stop_reason))
        usage = make_usage(ordered, self.body.n)
        return ChatCompletionResponse(self.id, self.created, self.serving.model_name, choices, usage)

    async def chunks(self, group: RequestGroup) -> AsyncIterator[ChatCompletionChunk]:
        """A role chunk per choice, content deltas, the finish reason, then usage when asked.

        With tools offered, a choice's text is held until it ends (a call cannot be told from
        content before then): its content, then one delta per tool call, then the finish reason.
        """
        for index in range(self.body.n):
            yield self._chunk([ChatChunkChoice(index, ChatDelta(role="assistant", content=""))])
        trackers: dict[int, DeltaTracker] = {}
        finals = {}
        async for index, output in group.outputs():
            completion = output.outputs[0]
            check_finished(completion)
            if self.use.active:
                if output.finished:
                    finals[index] = output
                    for chunk in self._tool_chunks(index, completion):
                        yield chunk
                continue
            delta = trackers.setdefault(index, DeltaTracker()).advance(completion)
            if not (delta.text or delta.logprobs or output.finished):
                continue
            logprobs = chat_logprobs(self.serving.tokenizer, delta.logprobs) if self.body.logprobs else None
            finish = completion.finish_reason if output.finished else None
            yield self._chunk([ChatChunkChoice(index, ChatDelta(content=delta.text), logprobs, finish)])
            if output.finished:
                finals[index] = output
        options = self.body.stream_options
        if options is not None and options.include_usage:
            yield self._chunk([], usage=make_usage([finals[i] for i in sorted(finals)], self.body.n))

    def _tool_chunks(self, index: int, completion) -> list[ChatCompletionChunk]:
        content, calls = split_output(completion.text, self.use, self.serving.tool_parser)
        chunks = [self._chunk([ChatChunkChoice(index, ChatDelta(content=content))])] if content else []
        for position, call in enumerate(calls):
            delta = ToolCallDelta(position, FunctionCallDelta(call.function.name, call.function.arguments), call.id,
                                  "function")
            chunks.append(self._chunk([ChatChunkChoice(index, ChatDelta(tool_calls=[delta]))]))
        chunks.append(self._chunk([ChatChunkChoice(index, ChatDelta(), None, _finish_reason(completion, calls))]))
        return chunks


def _finish_reason(completion, calls: list) -> str | None:
    """``tool_calls`` when the model stopped after calling tools, its own finish reason otherwise."""
    return "tool_calls" if calls and completion.finish_reason == "stop" else completion.finish_reason
