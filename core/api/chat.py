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
    TokenNames,
    chat_logprobs,
    check_finished,
    continuous_usage,
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
from spyglass.core.api.tools import (
    OutputSplitter,
    ToolUse,
    constraint,
    new_call_id,
    prompt_messages,
    split_output,
    tool_use,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.tokenizer import Tokenizer

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
_NO_TOOLS = ToolUse([], "none")


@dataclasses.dataclass(frozen=True, slots=True)
class TemplateOptions:
    """How the chat template renders a conversation: vLLM's ``add_generation_prompt``,
    ``continue_final_message`` (the prompt ends inside the last message, for the model to carry
    on) and ``chat_template_kwargs`` (further template variables)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: dict | None = None

    @classmethod
    def of(cls, body) -> "TemplateOptions":
        """The options a chat or tokenize body asks for; a 400 for both a generation prompt and a
        continued final message."""
        if body.add_generation_prompt and body.continue_final_message:
            raise APIError(
                400,
                "continue_final_message needs add_generation_prompt set to false",
                "continue_final_message",
            )
        return cls(
            body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs
        )


def render_messages(
    messages: list[ChatMessage],
    tokenizer: Tokenizer,
    use: ToolUse = _NO_TOOLS,
    param: str = "messages",
    template: TemplateOptions = TemplateOptions(),
) -> tuple[list[dict], str]:
    """Plain message dicts (HF's shape, tool calls and results included) and the prompt the chat template makes."""
    if not messages:
        raise APIError(400, f"{param} must not be empty", param)
    plain = [_plain(message, param) for message in messages]
    takes_tools = tokenizer.template_takes_tools
    try:
        prompt = tokenizer.apply_chat_template(
            prompt_messages(plain, use, takes_tools),
            add_generation_prompt=template.add_generation_prompt,
            tools=use.tools if use.active and takes_tools else None,
            continue_final_message=template.continue_final_message,
            template_kwargs=template.kwargs,
        )
    except (ValueError, jinja2.TemplateError) as error:
        raise APIError(400, f"cannot apply the chat template: {error}", param) from error
    return plain, prompt


def _plain(message: ChatMessage, param: str) -> dict:
    # Roles and part types are checked by the schema; developer messages are system messages here.
    content = message.content
    if isinstance(content, list):
        content = "\n".join(part.text for part in content)
    plain = {"role": _ROLES[message.role], "content": content or ""}
    if message.role == "tool":
        plain["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        plain["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(call.function.arguments, param),
                },
            }
            for call in message.tool_calls
        ]
    return plain


def _arguments(text: str, param: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise APIError(400, "a tool call's arguments must be a JSON object in a string", param)
    return value


@post(
    "/v1/chat/completions",
    summary="Create a chat completion",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ChatCompletionRequest},
)
async def create_chat_completion(
    data: JSONBody[ChatCompletionRequest],
    request: Request,
    serving: NamedDependency[ServingContext],
) -> Response:
    """OpenAI's chat completions endpoint; ``stream=true`` answers with server-sent events."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    max_tokens = (
        data.max_completion_tokens if data.max_completion_tokens is not None else data.max_tokens
    )
    if data.top_logprobs is not None and not data.logprobs:
        raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
    params = sampling_params(data, max_tokens, (data.top_logprobs or 0) if data.logprobs else None)
    use = tool_use(data)
    response_id = new_id("chatcmpl")
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    template = TemplateOptions.of(data)
    group = await start_chat(
        serving,
        request,
        data.messages,
        use,
        params,
        response_id,
        attributes,
        template=template,
        lora_name=lora_name,
    )
    writer = _ChatWriter(serving, data, response_id, use)
    if data.stream:
        return event_stream(writer.chunks(group))
    return Response(await unless_disconnected(request, writer.collect(group)))


async def start_chat(
    serving: ServingContext,
    request: Request,
    messages: list[ChatMessage],
    use: ToolUse,
    params: SamplingParams,
    response_id: str,
    attributes: dict,
    param: str = "messages",
    template: TemplateOptions = TemplateOptions(),
    lora_name: str | None = None,
) -> RequestGroup:
    """Render the conversation, tokenize it and start its ``params.n`` engine requests (chat, Messages, Responses).

    ``tool_choice`` required or named becomes the output constraint; a 400 if the request already
    has one. ``param`` is the request field that errors about the conversation name; ``lora_name``
    is the LoRA adapter the requests run with.
    """
    if (tool_constraint := constraint(use)) is not None:
        if params.structured_output is not None:
            raise APIError(
                400,
                "tool_choice required or named cannot be combined with another output constraint",
                "tool_choice",
            )
        params = dataclasses.replace(params, structured_output=tool_constraint)
    with serving.queue_slots(params.n):
        # Rendering and tokenizing a large conversation take a while: off the event loop, like tokenizing.
        plain, prompt = await asyncio.to_thread(
            render_messages, messages, serving.tokenizer, use, param, template
        )
        attributes["messages"] = plain
        if use.active:
            attributes["tools"] = use.tools  # for the LLM span's llm.tools.* attributes
        token_ids = await encode_text(
            serving,
            prompt,
            param,
            must_fit=params.truncate_prompt_tokens is None,
            add_special_tokens=False,
        )
        specs = fan_out([(token_ids, prompt)], params)
        group = RequestGroup(serving.async_engine, response_id, specs, attributes, lora_name)
        await unless_disconnected(request, group.start())
    return group


class _ChatWriter:
    """Builds the response or the stream of chunks for one chat call."""

    def __init__(
        self, serving: ServingContext, body: ChatCompletionRequest, response_id: str, use: ToolUse
    ):
        self.serving = serving
        self.model = serving.response_model(body.model)
        self.body = body
        self.use = use
        self.id = response_id
        self.created = int(time.time())
        self._counted: RequestGroup | None = None
        """The group whose usage so far each chunk carries (``continuous_usage_stats``)."""
        self.names = TokenNames(serving.tokenizer, body.return_tokens_as_token_ids)
        last = body.messages[-1] if body.messages else None
        self.echo = ""
        """With vLLM's ``echo``, the final assistant message the answer starts with."""
        if body.echo and last is not None and last.role == "assistant":
            self.echo = _plain(last, "messages")["content"]

    def _chunk(self, choices: list[ChatChunkChoice], usage=None) -> ChatCompletionChunk:
        if usage is None and self._counted is not None:
            usage = make_usage(self._counted, self.body.n)
        return ChatCompletionChunk(self.id, self.created, self.model, choices, usage=usage)

    async def collect(self, group: RequestGroup) -> ChatCompletionResponse:
        """Run every choice to the end and build the full response."""
        ordered = await group.final_outputs()
        choices = []
        for index, output in enumerate(ordered):
            completion = output.outputs[0]
            check_finished(completion)
            logprobs = (
                chat_logprobs(self.names, completion.logprobs or []) if self.body.logprobs else None
            )
            content, calls = split_output(completion.text, self.use, self.serving.tool_parser)
            if self.echo:
                content = self.echo + (content or "")
            message = AssistantMessage(content, tool_calls=calls)
            choices.append(
                ChatChoice(
                    index,
                    message,
                    logprobs,
                    _finish_reason(completion, len(calls)),
                    completion.stop_reason,
                )
            )
        usage = make_usage(group, self.body.n)
        return ChatCompletionResponse(self.id, self.created, self.model, choices, usage)

    async def chunks(self, group: RequestGroup) -> AsyncIterator[ChatCompletionChunk]:
        """A role chunk per choice, content deltas, the finish reason, then usage when asked.

        With tools offered, content and tool calls are parsed as they are generated: a call's first
        delta carries its id, type and name, the next ones fragments of its arguments.
        """
        if continuous_usage(self.body):
            self._counted = group
        for index in range(self.body.n):
            yield self._chunk([ChatChunkChoice(index, ChatDelta(role="assistant", content=""))])
            if self.echo:
                yield self._chunk([ChatChunkChoice(index, ChatDelta(content=self.echo))])
        splitters: dict[int, OutputSplitter] = {}
        async for index, output in group.outputs():
            completion = output.outputs[0]
            check_finished(completion)
            if self.use.active:
                splitter = splitters.setdefault(
                    index, OutputSplitter(self.use, self.serving.tool_parser)
                )
                for chunk in self._tool_chunks(index, splitter, output):
                    yield chunk
                continue
            if not (completion.text or completion.logprobs or output.finished):
                continue
            logprobs = (
                chat_logprobs(self.names, completion.logprobs or []) if self.body.logprobs else None
            )
            finish = completion.finish_reason if output.finished else None
            yield self._chunk(
                [ChatChunkChoice(index, ChatDelta(content=completion.text), logprobs, finish)]
            )
        options = self.body.stream_options
        if options is not None and options.include_usage:
            yield self._chunk([], usage=make_usage(group, self.body.n))

    def _tool_chunks(
        self, index: int, splitter: OutputSplitter, output: RequestOutput
    ) -> list[ChatCompletionChunk]:
        chunks = []
        for piece in splitter.advance(output):
            if piece.kind == "content":
                delta = ChatDelta(content=piece.text)
            elif piece.kind == "call":
                call = ToolCallDelta(
                    piece.index, FunctionCallDelta(piece.text), new_call_id(), "function"
                )
                delta = ChatDelta(tool_calls=[call])
            else:
                delta = ChatDelta(
                    tool_calls=[ToolCallDelta(piece.index, FunctionCallDelta(arguments=piece.text))]
                )
            chunks.append(self._chunk([ChatChunkChoice(index, delta)]))
        if output.finished:
            finish = _finish_reason(output.outputs[0], splitter.num_calls)
            chunks.append(self._chunk([ChatChunkChoice(index, ChatDelta(), None, finish)]))
        return chunks


def _finish_reason(completion, num_calls: int) -> str | None:
    """``tool_calls`` when the model stopped after calling tools, its own finish reason otherwise."""
    return (
        "tool_calls"
        if num_calls and completion.finish_reason == "stop"
        else completion.finish_reason
    )
