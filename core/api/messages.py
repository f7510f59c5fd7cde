"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API over the same
chat machinery (template, tools, constraints).

Messages become chat turns (``system`` first, ``tool_use`` blocks as assistant tool calls,
``tool_result`` blocks as tool turns); ``tool_choice`` ``auto``, ``any``, ``tool`` and ``none`` map to
the chat API's ``auto``, ``required``, a named function and ``none``; ``output_config.format`` is
the output constraint, as chat's ``response_format``. Streams send Anthropic's
named events: ``message_start``, a ``content_block_start`` / ``_delta`` / ``_stop`` run per block
(text deltas as they are generated; a tool call's block starts once its name is generated, and its
``input_json_delta``s follow the arguments as they are written), ``message_delta`` with the stop
reason and usage, and ``message_stop``. Errors keep this server's OpenAI-shaped body.
"""

import dataclasses
import json
import uuid
from collections.abc import AsyncIterator

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.chat import TemplateOptions, render_conversation, start_chat
from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import check_finished, given_or, new_id, request_attributes
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import RequestGroup, output_kind, unless_disconnected
from spyglass.core.api.messages_schemas import (
    Conversation,
    ImageBlock,
    MessageResponse,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    TokenCount,
    ToolResultBlock,
    ToolUseBlock,
    URLImageSource,
    Usage,
)
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.reasoning_output import (
    ChoiceSplitter,
    reasoning_for,
    split_choice,
    thinking_constraint,
)
from spyglass.core.api.schemas import (
    ChatMessage,
    FunctionCall,
    ImageURL,
    ImageURLPart,
    TextPart,
    ToolCall,
)
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.tools import (
    ToolUse,
    choose_tools,
    function_tool,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.outputs import CompletionOutput, RequestOutput
from spyglass.core.engine.prompt_images import prompt_with_image_tokens
from spyglass.core.engine.reasoning import ReasoningParser
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput


def chat_messages(body: Conversation) -> list[ChatMessage]:
    """The conversation as chat turns."""
    turns = []
    if body.system:
        system = (
            body.system
            if isinstance(body.system, str)
            else "\n".join(block.text for block in body.system)
        )
        turns.append(ChatMessage("system", system))
    for message in body.messages:
        if isinstance(message.content, str):
            turns.append(ChatMessage(message.role, message.content))
            continue
        text = "\n".join(block.text for block in message.content if isinstance(block, TextBlock))
        if message.role == "assistant":
            if any(isinstance(block, ImageBlock) for block in message.content):
                raise APIError(400, "images go in user turns, not assistant ones", "messages")
            calls = [
                ToolCall(id=block.id, function=FunctionCall(block.name, json.dumps(block.input)))
                for block in message.content
                if isinstance(block, ToolUseBlock)
            ]
            turns.append(ChatMessage("assistant", text or None, tool_calls=calls or None))
            continue
        for block in message.content:
            if isinstance(block, ToolResultBlock):
                result = (
                    block.content
                    if isinstance(block.content, str)
                    else "\n".join(b.text for b in block.content)
                )
                if block.is_error:  # chat templates have no flag for it: the model reads it
                    result = f"Error: {result}"
                turns.append(ChatMessage("tool", result, tool_call_id=block.tool_use_id))
        images = any(isinstance(block, ImageBlock) for block in message.content)
        if images:
            turns.append(ChatMessage("user", _chat_parts(message.content)))
        elif text:
            turns.append(ChatMessage("user", text))
    return turns


def _image_url(block: ImageBlock) -> str:
    """An image block's source as a chat image URL: its own URL, or its bytes as a data URL."""
    source = block.source
    if isinstance(source, URLImageSource):
        return source.url
    return f"data:{source.media_type};base64,{source.data}"


def _chat_parts(blocks: list) -> list[TextPart | ImageURLPart]:
    """A user turn's text and image blocks as chat content parts, in order."""
    return [
        TextPart(block.text)
        if isinstance(block, TextBlock)
        else ImageURLPart(ImageURL(_image_url(block)))
        for block in blocks
        if isinstance(block, TextBlock | ImageBlock)
    ]


def tool_use(body: Conversation) -> ToolUse:
    """The request's tools and choice in the chat API's terms; a 400 for a choice that cannot be met."""
    tools = [function_tool(t.name, t.description, t.input_schema) for t in body.tools or []]
    strict = frozenset(t.name for t in body.tools or [] if t.strict)
    choice = body.tool_choice
    if choice is None:
        return choose_tools(tools, None, strict=strict)
    mode = {"any": "required", "tool": "forced"}.get(choice.type, choice.type)
    parallel = not choice.disable_parallel_tool_use
    return choose_tools(tools, mode, choice.name, parallel=parallel, strict=strict)


def output_format(body: MessagesRequest) -> StructuredOutput | None:
    """``output_config.format`` as the output constraint (Anthropic's structured outputs)."""
    spec = body.output_config.format if body.output_config else None
    return None if spec is None else StructuredOutput("json_schema", spec.schema_)


def thinking_template(body: Conversation, serving: ServingContext) -> TemplateOptions:
    """How ``thinking`` renders the prompt: as the chat template's ``enable_thinking`` (Qwen3's
    switch) where the template reads it. A 400 where the setting cannot hold: ``disabled`` for a
    reasoning model whose template has no switch (the server would return its thinking anyway),
    ``adaptive`` or ``enabled`` on a server that returns no thinking (no ``--reasoning-parser``)."""
    if body.thinking is None:
        return TemplateOptions()
    thinks = body.thinking.type != "disabled"
    if thinks and serving.reasoning_parser is None:
        raise APIError(
            400,
            f"thinking {body.thinking.type} needs a server started with --reasoning-parser: this "
            "one returns no thinking",
            "thinking",
        )
    if serving.tokenizer.template_reads("enable_thinking"):
        return TemplateOptions(kwargs={"enable_thinking": thinks})
    if not thinks and serving.reasoning_parser is not None:
        raise APIError(
            400,
            "thinking cannot be disabled: this model's chat template has no enable_thinking "
            "switch, and the server returns the model's thinking",
            "thinking",
        )
    return TemplateOptions()


def thinking_budget(
    body: MessagesRequest, serving: ServingContext, params: SamplingParams
) -> StructuredOutput | None:
    """``thinking: {"type": "enabled", "budget_tokens": N}`` as a constraint: the reasoning
    format's rules of a thought of at most N tokens (`ReasoningParser.reasoning_rules`), then
    any text, or the answer ``output_config.format`` asks for; None for the other settings. A 400
    where it cannot hold: no budget, one not below ``max_tokens`` (as Anthropic refuses it), or a
    format without such rules."""
    thinking = body.thinking
    if thinking is None or thinking.type != "enabled":
        if thinking is not None and thinking.budget_tokens is not None:
            raise APIError(
                400, "budget_tokens goes with thinking type enabled", "thinking.budget_tokens"
            )
        return None
    budget = thinking.budget_tokens
    if budget is None:
        raise APIError(400, "thinking enabled needs budget_tokens", "thinking.budget_tokens")
    if budget >= body.max_tokens:
        raise APIError(
            400, "max_tokens must be greater than thinking.budget_tokens", "thinking.budget_tokens"
        )
    return thinking_constraint(
        serving.reasoning_parser,
        params.structured_output,
        budget,
        required=True,
        param="thinking.budget_tokens",
    )


@post(
    "/v1/messages",
    summary="Create a message (Anthropic Messages API)",
    tags=["anthropic"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": MessagesRequest},
)
async def create_message(
    data: JSONBody[MessagesRequest], request: Request, serving: NamedDependency[ServingContext]
) -> Response:
    """Anthropic's Messages endpoint; ``stream=true`` answers with its named server-sent events."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    use = tool_use(data)
    defaults = serving.sampling_defaults
    params = SamplingParams(
        temperature=given_or(data.temperature, defaults.temperature),
        top_p=given_or(data.top_p, defaults.top_p),
        top_k=given_or(data.top_k, defaults.top_k),
        min_p=defaults.min_p,
        repetition_penalty=defaults.repetition_penalty,
        max_tokens=data.max_tokens,
        stop=[s for s in data.stop_sequences or [] if s],
        structured_output=output_format(data),
    )
    template = thinking_template(data, serving)
    budget = thinking_budget(data, serving, params)
    reasoning = reasoning_for(serving.reasoning_parser, params, use)
    if budget is not None:  # the answer's reasoning is still split: the constraint holds its length
        params = dataclasses.replace(params, structured_output=budget)
    response_id = new_id("msg")
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    if budget is not None:
        attributes["thinking_budget"] = data.thinking.budget_tokens
    group = await start_chat(
        serving,
        request,
        chat_messages(data),
        use,
        params,
        response_id,
        attributes,
        template=template,
        lora_name=lora_name,
        kind=output_kind(data.stream),
        reasoning=reasoning,
    )
    writer = _MessageWriter(serving, data, response_id, use, reasoning)
    if data.stream:
        return event_stream(writer.events(group), named=True)
    return Response(await unless_disconnected(request, writer.collect(group)))


@post(
    "/v1/messages/count_tokens",
    summary="Count a message's input tokens (Anthropic Messages API)",
    tags=["anthropic"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": Conversation},
)
async def count_message_tokens(
    data: JSONBody[Conversation], serving: NamedDependency[ServingContext]
) -> TokenCount:
    """The ``input_tokens`` that ``POST /v1/messages`` with this conversation and these tools
    would report: the same template render and tokenizer. Nothing runs on the engine; a
    conversation longer than the context is counted, not refused."""
    serving.check_model(data.model)
    template = thinking_template(data, serving)
    _, prompt, media = await render_conversation(
        serving, chat_messages(data), tool_use(data), template=template
    )
    token_ids = await encode_text(
        serving, prompt, "messages", must_fit=False, add_special_tokens=False
    )
    token_ids = prompt_with_image_tokens(token_ids, media.images, serving.vision, "messages")
    return TokenCount(len(token_ids))


class _MessageWriter:
    """Builds the message, or its stream of events, for one call."""

    def __init__(
        self,
        serving: ServingContext,
        body: MessagesRequest,
        response_id: str,
        use: ToolUse,
        reasoning: ReasoningParser | None,
    ):
        self.serving = serving
        self.body = body
        self.id = response_id
        self.use = use
        self.reasoning = reasoning

    async def collect(self, group: RequestGroup) -> MessageResponse:
        """Run to the end and build the message."""
        (output,) = await group.final_outputs()
        completion = output.outputs[0]
        check_finished(completion)
        thought, content, calls = split_choice(
            completion.text, self.reasoning, self.use, self.serving.tool_format
        )
        uses = [
            ToolUseBlock(_tool_use_id(), call.function.name, _input(call.function.arguments))
            for call in calls
        ]
        thinking = [ThinkingBlock(thought)] if thought else []
        blocks = [*thinking, *([TextBlock(content)] if content else []), *uses]
        reason, sequence = _stop(completion, len(uses))
        usage = _usage(output, len(completion.token_ids))
        return MessageResponse(
            id=self.id,
            model=self.body.model,
            content=blocks,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=usage,
        )

    async def events(self, group: RequestGroup) -> AsyncIterator[tuple[str, dict]]:
        """Anthropic's event sequence for one message: a block per run of text and per tool call, as generated."""
        splitter = ChoiceSplitter(self.reasoning, self.use, self.serving.tool_format)
        index, open_kind, output = -1, None, None
        async for _, output in group.outputs():
            completion = output.outputs[0]
            check_finished(completion)
            if index == -1:
                index = 0
                yield (
                    "message_start",
                    {
                        "type": "message_start",
                        "message": {
                            "id": self.id,
                            "type": "message",
                            "role": "assistant",
                            "model": self.body.model,
                            "content": [],
                            "stop_reason": None,
                            "stop_sequence": None,
                            "usage": msgspec.structs.asdict(_usage(output, 0)),
                        },
                    },
                )
            for piece in splitter.advance(output):
                if piece.kind == "arguments":
                    yield (
                        "content_block_delta",
                        _block_delta(
                            index, {"type": "input_json_delta", "partial_json": piece.text}
                        ),
                    )
                    continue
                if open_kind is not None and (piece.kind == "call" or open_kind != piece.kind):
                    yield "content_block_stop", {"type": "content_block_stop", "index": index}
                    index += 1
                if piece.kind == "call":
                    open_kind = "call"
                    yield (
                        "content_block_start",
                        _block_start(
                            index,
                            {
                                "type": "tool_use",
                                "id": _tool_use_id(),
                                "name": piece.text,
                                "input": {},
                            },
                        ),
                    )
                    continue
                if piece.kind == "reasoning":
                    if open_kind != "reasoning":
                        open_kind = "reasoning"
                        block = {"type": "thinking", "thinking": "", "signature": ""}
                        yield "content_block_start", _block_start(index, block)
                    delta = {"type": "thinking_delta", "thinking": piece.text}
                    yield "content_block_delta", _block_delta(index, delta)
                    continue
                if open_kind != "content":
                    open_kind = "content"
                    yield "content_block_start", _block_start(index, {"type": "text", "text": ""})
                yield (
                    "content_block_delta",
                    _block_delta(index, {"type": "text_delta", "text": piece.text}),
                )
        if open_kind is not None:
            yield "content_block_stop", {"type": "content_block_stop", "index": index}
        completion = output.outputs[0]
        reason, sequence = _stop(completion, splitter.num_calls)
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": group.num_tokens[0]},
            },
        )
        yield "message_stop", {"type": "message_stop"}


def _usage(output: RequestOutput, output_tokens: int) -> Usage:
    """The message's usage: its prompt's tokens computed afresh and read from the prefix cache."""
    cached = output.num_cached_tokens
    return Usage(len(output.prompt_token_ids) - cached, output_tokens, 0, cached)


def _tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def _block_delta(index: int, delta: dict) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _block_start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _input(arguments: str) -> dict:
    # Arguments a model wrote freely (tool_choice auto) may be cut short or not JSON: kept, never a 500.
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"value": value}


def _stop(completion: CompletionOutput, num_calls: int) -> tuple[str | None, str | None]:
    """Anthropic's stop reason and, for a stop string, the string."""
    if num_calls and completion.finish_reason == "stop":
        return "tool_use", None
    if completion.finish_reason == "length":
        return "max_tokens", None
    if isinstance(completion.stop_reason, str):
        return "stop_sequence", completion.stop_reason
    return "end_turn", None
