"""``POST /v1/chat/completions``: the model's chat template over the messages, streamed or not."""

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import jinja2
import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.beam_search_api import check_beam_search, run_beam_search
from spyglass.core.api.chat_store import StoredChatCompletion
from spyglass.core.api.chunk_fold import ChunkFold
from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import (
    TokenNames,
    chat_logprobs,
    check_finished,
    continuous_usage,
    make_usage,
    new_id,
    prompt_logprobs,
    request_attributes,
    sampling_params,
    token_ids_if,
)
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import (
    RequestGroup,
    fan_out,
    output_kind,
    unless_disconnected,
)
from spyglass.core.api.media_fetch import fetch_images
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.reasoning_output import (
    ChoiceSplitter,
    answer_reading,
    held_after_reasoning,
    reads_special_tokens,
    reasoning_for,
    split_choice,
    thinking_constraint,
)
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
    ImageURLPart,
    TextPart,
    ToolCallDelta,
    Usage,
    VideoURLPart,
)
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.api.service_tiers import tier_priority, tier_served
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.tools import (
    DEFAULT_TOOL_FORMAT,
    ToolFormat,
    ToolUse,
    check_prompted_format,
    constraint,
    new_call_id,
    prompt_messages,
    strict_constraint,
    tool_use,
    with_prompt_call_ids,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.beam_search import BeamSearchParams
from spyglass.core.engine.chat_images import ChatMedia, render_with_images, take_images
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.reasoning import ReasoningParser, ReasoningPiece
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams
from spyglass.core.engine.tool_calls import ToolCallPiece
from spyglass.core.engine.video_sampling import DEFAULT_VIDEO_SAMPLING, VideoSampling
from spyglass.core.tokenizer import Tokenizer, compile_chat_template

if TYPE_CHECKING:
    from spyglass.core.models.vision_config import VisionConfig

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
    on), ``chat_template_kwargs`` (further template variables), ``chat_template`` (the request's
    own template instead of the model's) and ``documents`` (retrieval-augmented templates')."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: dict | None = None
    chat_template: str | None = None
    documents: list[dict] | None = None
    reasoning_effort: str | None = None
    effort_param: str = "reasoning_effort"  # the request field that errors about it name

    @classmethod
    def of(cls, body, server: ServerOptions) -> "TemplateOptions":
        """The options a chat, tokenize or embeddings body asks for; a 400 for both a generation
        prompt and a continued final message, and for a template of the request's own unless
        the server trusts them (``--trust-request-chat-template``: a template is code the server
        runs, if sandboxed)."""
        if body.add_generation_prompt and body.continue_final_message:
            raise APIError(
                400,
                "continue_final_message needs add_generation_prompt set to false",
                "continue_final_message",
            )
        chat_template = getattr(body, "chat_template", None)
        if chat_template is not None and not server.trust_request_chat_template:
            raise APIError(
                400,
                "chat_template of the request's own needs a server started with "
                "--trust-request-chat-template",
                "chat_template",
            )
        return cls(
            body.add_generation_prompt,
            body.continue_final_message,
            body.chat_template_kwargs,
            chat_template,
            getattr(body, "documents", None),
            getattr(body, "reasoning_effort", None),
        )


def render_messages(
    messages: list[ChatMessage],
    tokenizer: Tokenizer,
    use: ToolUse = _NO_TOOLS,
    param: str = "messages",
    template: TemplateOptions = TemplateOptions(),
    vision: "VisionConfig | None" = None,
    fetched: dict[str, bytes] | None = None,
    sampling: VideoSampling = DEFAULT_VIDEO_SAMPLING,
    tool_format: ToolFormat = DEFAULT_TOOL_FORMAT,
) -> tuple[list[dict], str, ChatMedia]:
    """Plain message dicts (HF's shape, tool calls and results included; an image part as
    ``{"type": "image"}``, a video's as ``{"type": "video"}``), the prompt the chat template
    makes, and the messages' images and videos. ``vision`` is the served vision model's (images
    are a 400 without it); ``fetched`` holds the bytes of image and video URLs other than data
    URLs (`media_fetch`); a video file's frames are sampled as ``sampling`` says. ``tool_format``
    is the server's (`check_prompted_format`; the template sees call ids as its parser writes
    them, `with_prompt_call_ids`)."""
    if not messages:
        raise APIError(400, f"{param} must not be empty", param)
    if template.chat_template is not None:
        try:
            compile_chat_template(template.chat_template)
        except jinja2.TemplateError as error:
            raise APIError(
                400, f"chat_template does not compile: {error}", "chat_template"
            ) from None
        tokenizer = tokenizer.with_chat_template(template.chat_template)
    plain = [_plain(message, param) for message in messages]
    if vision is None and any(isinstance(m["content"], list) for m in plain):
        raise APIError(
            400,
            f"{param} holds an image or video: only a vision model's (LLaVA's) chat, Responses, "
            "Messages and embeddings calls take images (not beam search); Qwen2-VL's, "
            "Qwen3-VL's and LLaVA-OneVision's chat calls take videos",
            param,
        )
    takes_tools = tokenizer.template_takes_tools
    check_prompted_format(use, takes_tools, tool_format)
    options = {
        "add_generation_prompt": template.add_generation_prompt,
        "tools": use.tools if use.active and takes_tools else None,
        "continue_final_message": template.continue_final_message,
        "template_kwargs": _template_kwargs(template, tokenizer),
        "documents": template.documents,
    }
    media = ChatMedia()
    if vision is not None:
        plain, media = take_images(plain, param, fetched, sampling)
    try:
        conversation = prompt_messages(with_prompt_call_ids(plain, tool_format), use, takes_tools)
        if vision is None:
            prompt = tokenizer.apply_chat_template(conversation, **options)
        else:
            image_text = tokenizer.decode([vision.placeholder_id], skip_special_tokens=False)
            prompt = render_with_images(tokenizer, conversation, image_text, **options)
    except (ValueError, jinja2.TemplateError) as error:
        raise APIError(400, f"cannot apply the chat template: {error}", param) from error
    return plain, prompt, media


async def render_conversation(
    serving: ServingContext,
    messages: list[ChatMessage],
    use: ToolUse = _NO_TOOLS,
    param: str = "messages",
    template: TemplateOptions = TemplateOptions(),
) -> tuple[list[dict], str, ChatMedia]:
    """`render_messages` for the served model, off the event loop, its image and video URLs
    fetched first (a vision model's; others refuse images before anything is fetched)."""
    fetched = {}
    if serving.vision is not None:
        _check_media_count(messages, ImageURLPart, serving.max_images_per_prompt, param)
        _check_media_count(messages, VideoURLPart, serving.max_videos_per_prompt, param)
        fetched = await fetch_images(messages, serving.options, param)
    return await asyncio.to_thread(
        render_messages,
        messages,
        serving.tokenizer,
        use,
        param,
        template,
        serving.vision,
        fetched,
        serving.video_sampling,
        serving.tool_format,
    )


def _check_media_count(
    messages: list[ChatMessage], kind: type, limit: int | None, param: str
) -> None:
    """A 400 before any image or video is fetched or decoded when the conversation holds more
    than ``limit`` parts of ``kind`` (``--limit-mm-per-prompt``)."""
    count = sum(
        isinstance(part, kind)
        for message in messages
        if isinstance(message.content, list)
        for part in message.content
    )
    if limit is not None and count > limit:
        what = "images" if kind is ImageURLPart else "videos"
        raise APIError(
            400, f"a prompt may hold at most {limit} {what} (--limit-mm-per-prompt)", param
        )


def _template_kwargs(template: TemplateOptions, tokenizer: Tokenizer) -> dict | None:
    """The template variables beyond the conversation: ``chat_template_kwargs``, and
    ``reasoning_effort`` where the template reads it (a 400 where it would change nothing)."""
    if template.reasoning_effort is None:
        return template.kwargs
    if not tokenizer.template_reads("reasoning_effort"):
        raise APIError(
            400,
            f"{template.effort_param} is not read by this model's chat template, so it would "
            "change nothing; leave it out",
            template.effort_param,
            "unsupported_parameter",
        )
    return {**(template.kwargs or {}), "reasoning_effort": template.reasoning_effort}


def _plain(message: ChatMessage, param: str) -> dict:
    # Roles and part types are checked by the schema; developer messages are system messages here.
    content = message.content
    if isinstance(content, list):
        content = _parts(content)
    plain = {"role": _ROLES[message.role], "content": content or ""}
    if message.name is not None:  # the participant's name, for templates that render it
        plain["name"] = message.name
    if message.role == "tool":
        plain["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:  # Qwen3's template renders the latest turn's
        plain["reasoning_content"] = message.reasoning_content
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


def _parts(parts: list[TextPart | ImageURLPart | VideoURLPart]) -> str | list[dict]:
    """Text parts joined into one string; with an image or video among them, every part as a
    dict."""
    if all(isinstance(part, TextPart) for part in parts):
        return "\n".join(part.text for part in parts)
    return [_part(part) for part in parts]


def _part(part: TextPart | ImageURLPart | VideoURLPart) -> dict:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImageURLPart):
        return {"type": "image_url", "image_url": {"url": part.image_url.url}}
    return {"type": "video_url", "video_url": {"url": part.video_url.url}}


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
    if max_tokens is None:
        max_tokens = serving.sampling_defaults.max_tokens
    logprobs = (data.top_logprobs or 0) if data.logprobs else None
    params = sampling_params(data, max_tokens, logprobs, serving.sampling_defaults)
    priority = tier_priority(data.service_tier, params.priority, serving.orders_by_priority)
    params = dataclasses.replace(params, priority=priority)
    if data.prompt_logprobs is not None:
        if data.stream:
            raise APIError(
                400, "prompt_logprobs are not available when streaming", "prompt_logprobs"
            )
        params = dataclasses.replace(params, prompt_logprobs=data.prompt_logprobs)
    if data.prediction is not None:
        predicted = serving.tokenizer.encode(data.prediction.text, add_special_tokens=False)
        params = dataclasses.replace(params, prediction=predicted)
    use = tool_use(data)
    response_id = new_id("chatcmpl")
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    if data.store:
        if not serving.chat_completions.capacity:
            message = "this server keeps no chat completions (--chat-completions-store-size 0)"
            raise APIError(400, message, "store", "unsupported_parameter")
        attributes["stored"] = True
    template = TemplateOptions.of(data, serving.options)
    # Without max_tokens the beams may grow to the context (the search stops there).
    beams = check_beam_search(data, max_tokens or serving.max_model_len)
    if beams is not None:
        search = _beam_search(
            serving, data, beams, params, response_id, attributes, template, lora_name
        )
        return Response(_kept(serving, data, await unless_disconnected(request, search)))
    reasoning = reasoning_for(serving.reasoning_parser, params, use)
    if data.thinking_token_budget is not None:  # the reasoning is still split: it only has a limit
        spec = thinking_constraint(
            serving.reasoning_parser,
            params.structured_output,
            data.thinking_token_budget,
            required=False,
            param="thinking_token_budget",
        )
        params = dataclasses.replace(params, structured_output=spec)
        attributes["thinking_budget"] = data.thinking_token_budget
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
        kind=output_kind(data.stream, reads_deltas=reasoning is not None),
        add_special_tokens=data.add_special_tokens,
        reasoning=reasoning,
    )
    writer = _ChatWriter(serving, data, response_id, use, reasoning)
    if data.stream:
        kept = data.store
        return event_stream(_kept_stream(data, writer, group) if kept else writer.chunks(group))
    return Response(_kept(serving, data, await unless_disconnected(request, writer.collect(group))))


def _kept(
    serving: ServingContext, body: ChatCompletionRequest, completion: ChatCompletionResponse
) -> ChatCompletionResponse:
    """``completion``, stored first when the call asked (``store: true``) with its metadata and
    messages."""
    if body.store:
        kept = msgspec.to_builtins(completion) | {"metadata": dict(body.metadata or {})}
        stored = StoredChatCompletion(kept, tuple(body.messages))
        serving.chat_completions.put(stored.id, stored)
    return completion


async def _kept_stream(
    body: ChatCompletionRequest, writer: "_ChatWriter", group: RequestGroup
) -> AsyncIterator[ChatCompletionChunk]:
    """The call's chunks; once they have all gone out, the completion they add up to is stored."""
    fold = ChunkFold()
    async for chunk in writer.chunks(group):
        fold.add(chunk)
        yield chunk
    _kept(writer.serving, body, fold.completion(writer.usage(group)))


async def _beam_search(
    serving: ServingContext,
    data: ChatCompletionRequest,
    beams: BeamSearchParams,
    params: SamplingParams,
    response_id: str,
    attributes: dict,
    template: TemplateOptions,
    lora_name: str | None,
) -> ChatCompletionResponse:
    """The ``n`` best beams of the conversation's answer, best first."""
    with serving.queue_slots(beams.beam_width):
        plain, prompt, _ = await asyncio.to_thread(
            render_messages, data.messages, serving.tokenizer, template=template
        )
        attributes["messages"] = plain
        token_ids = await encode_text(
            serving, prompt, "messages", add_special_tokens=data.add_special_tokens
        )
    search, best = await run_beam_search(
        serving, response_id, token_ids, beams, params, attributes, lora_name
    )
    asked = data.return_token_ids
    choices = [
        ChatChoice(
            index,
            AssistantMessage(beam.text),
            None,
            beam.finish_reason,
            token_ids=token_ids_if(asked, search.generated(beam)),
        )
        for index, beam in enumerate(best)
    ]
    completion_tokens = sum(len(search.generated(beam)) for beam in best)
    usage = Usage(len(token_ids), completion_tokens, len(token_ids) + completion_tokens)
    model = serving.response_model(data.model)
    return ChatCompletionResponse(
        response_id,
        int(time.time()),
        model,
        choices,
        usage,
        prompt_token_ids=token_ids_if(asked, token_ids),
        service_tier=tier_served(data.service_tier),
    )


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
    kind: RequestOutputKind = RequestOutputKind.DELTA,
    add_special_tokens: bool = False,
    reasoning: ReasoningParser | None = None,
) -> RequestGroup:
    """Render the conversation, tokenize it and start its ``params.n`` engine requests (chat, Messages, Responses).

    The rendered text is encoded without the tokenizer's special tokens (the template writes
    what the model wants), unless ``add_special_tokens`` (vLLM's chat field) asks for them.

    ``tool_choice`` required or named becomes the output constraint, as do ``strict`` functions
    with ``auto`` (the tool-call format's grammar); a 400 if the request already has one. A
    format whose markers are special tokens keeps their text (`reads_special_tokens`).
    ``param`` is the request field that errors about the conversation name; ``lora_name`` is the
    LoRA adapter the requests run with; ``reasoning`` the reasoning parser their answers go
    through (`reasoning_for`), which with the tool format makes the requests' `AnswerReading`.
    """
    tool_constraint = constraint(use) or strict_constraint(use, serving.tool_parser)
    if tool_constraint is not None:
        if params.structured_output is not None:
            raise APIError(
                400,
                "tool_choice required or named, or strict functions, cannot be combined with "
                "another output constraint",
                "tool_choice",
            )
        params = dataclasses.replace(params, structured_output=tool_constraint)
    after = held_after_reasoning(serving.reasoning_parser, params.structured_output)
    params = dataclasses.replace(params, structured_output=after)
    if reads_special_tokens(serving.reasoning_parser, serving.tool_parser, params, use):
        params = dataclasses.replace(params, skip_special_tokens=False)
    with serving.queue_slots(params.n):
        # Rendering and tokenizing a large conversation take a while: off the event loop, like tokenizing.
        plain, prompt, media = await render_conversation(serving, messages, use, param, template)
        attributes["messages"] = plain
        if use.active:
            attributes["tools"] = use.tools  # for the LLM span's llm.tools.* attributes
        reading = answer_reading(
            reasoning, serving.options.reasoning_parser, use, serving.tool_format
        )
        if reading is not None:  # for plugins that read the answer (the LLM span's messages)
            attributes["answer_reading"] = reading
        token_ids = await encode_text(
            serving,
            prompt,
            param,
            must_fit=params.truncate_prompt_tokens is None,
            add_special_tokens=add_special_tokens,
        )
        token_ids, placed = await asyncio.to_thread(
            images_in_prompt,
            token_ids,
            media.images,
            serving.vision,
            serving.max_model_len,
            param,
            media.videos,
        )
        specs = fan_out([(token_ids, prompt)], params, placed)
        group = RequestGroup(serving.async_engine, response_id, specs, attributes, lora_name, kind)
        await unless_disconnected(request, group.start())
    return group


class _ChatWriter:
    """Builds the response or the stream of chunks for one chat call."""

    def __init__(
        self,
        serving: ServingContext,
        body: ChatCompletionRequest,
        response_id: str,
        use: ToolUse,
        reasoning: ReasoningParser | None = None,
    ):
        self.serving = serving
        self.model = serving.response_model(body.model)
        self.body = body
        self.use = use
        self.reasoning = reasoning
        self.id = response_id
        self.created = int(time.time())
        self._counted: RequestGroup | None = None
        """The group whose usage so far each chunk carries (``continuous_usage_stats``)."""
        self._splitters: dict[int, ChoiceSplitter] = {}
        """Per choice, the split of its output into reasoning, content and tool calls."""
        self.names = TokenNames(serving.tokenizer, body.return_tokens_as_token_ids)
        last = body.messages[-1] if body.messages else None
        self.echo = ""
        """With vLLM's ``echo``, the final assistant message the answer starts with."""
        if body.echo and last is not None and last.role == "assistant":
            self.echo = _plain(last, "messages")["content"]

    def _chunk(
        self, choices: list[ChatChunkChoice], usage=None, prompt_token_ids=msgspec.UNSET
    ) -> ChatCompletionChunk:
        if usage is None and self._counted is not None:
            usage = self.usage(self._counted)
        return ChatCompletionChunk(
            self.id,
            self.created,
            self.model,
            choices,
            usage=usage,
            prompt_token_ids=prompt_token_ids,
            service_tier=tier_served(self.body.service_tier),
        )

    def usage(self, group: RequestGroup):
        """The call's usage; with a reasoning parser, the tokens its choices spent reasoning."""
        reasoning_tokens = None
        if self.reasoning is not None:
            reasoning_tokens = sum(s.reasoning_tokens for s in self._splitters.values())
        predicted = self.body.prediction is not None
        return make_usage(group, self.body.n, reasoning_tokens, predicted)

    def _splitter(self, index: int) -> ChoiceSplitter:
        if index not in self._splitters:
            self._splitters[index] = ChoiceSplitter(
                self.reasoning, self.use, self.serving.tool_format
            )
        return self._splitters[index]

    async def collect(self, group: RequestGroup) -> ChatCompletionResponse:
        """Run every choice to the end and build the full response (each choice's deltas are
        split as they come too, to count the tokens spent reasoning)."""
        counting = None
        if self.reasoning is not None:

            def counting(index: int, output: RequestOutput) -> None:
                if index not in self._splitters:  # the echoed start first, as a stream has it
                    self._splitter(index).feed(self.echo)
                self._splitter(index).advance(output)

        ordered = await group.final_outputs(counting)
        choices = []
        for index, output in enumerate(ordered):
            completion = output.outputs[0]
            check_finished(completion)
            logprobs = (
                chat_logprobs(self.names, completion.logprobs or []) if self.body.logprobs else None
            )
            # An echoed message is the answer's start: split with it.
            thought, content, calls = split_choice(
                self.echo + completion.text, self.reasoning, self.use, self.serving.tool_format
            )
            message = AssistantMessage(content, tool_calls=calls, reasoning_content=thought)
            choices.append(
                ChatChoice(
                    index,
                    message,
                    logprobs,
                    _finish_reason(completion, len(calls)),
                    completion.stop_reason,
                    token_ids_if(self.body.return_token_ids, completion.token_ids),
                )
            )
        usage = self.usage(group)
        scored = None
        if self.body.prompt_logprobs is not None:  # the choices share their prompt
            scored = prompt_logprobs(self.names, ordered[0].prompt_logprobs)
        return ChatCompletionResponse(
            self.id,
            self.created,
            self.model,
            choices,
            usage,
            prompt_logprobs=scored,
            prompt_token_ids=token_ids_if(self.body.return_token_ids, ordered[0].prompt_token_ids),
            service_tier=tier_served(self.body.service_tier),
        )

    async def chunks(self, group: RequestGroup) -> AsyncIterator[ChatCompletionChunk]:
        """A role chunk per choice, content deltas, the finish reason, then usage when asked.

        With tools offered, content and tool calls are parsed as they are generated: a call's first
        delta carries its id, type and name, the next ones fragments of its arguments.
        """
        if continuous_usage(self.body):
            self._counted = group
        split = self.use.active or self.reasoning is not None
        asked = self.body.return_token_ids
        for index in range(self.body.n):
            # The choices share their prompt: its ids ride on the first chunk.
            prompt_ids = token_ids_if(asked and index == 0, group.latest[0].prompt_token_ids)
            role = ChatChunkChoice(index, ChatDelta(role="assistant", content=""))
            yield self._chunk([role], prompt_token_ids=prompt_ids)
            if split:
                for delta in _deltas(self._splitter(index).feed(self.echo)):
                    yield self._chunk([ChatChunkChoice(index, delta)])
            elif self.echo:
                yield self._chunk([ChatChunkChoice(index, ChatDelta(content=self.echo))])
        async for index, output in group.outputs():
            completion = output.outputs[0]
            check_finished(completion)
            if split:
                for chunk in self._split_chunks(index, self._splitter(index), output):
                    yield chunk
                continue
            ids = token_ids_if(asked, completion.token_ids)
            if not (completion.text or completion.logprobs or ids or output.finished):
                continue
            logprobs = (
                chat_logprobs(self.names, completion.logprobs or []) if self.body.logprobs else None
            )
            finish = completion.finish_reason if output.finished else None
            delta = ChatDelta(content=completion.text)
            yield self._chunk([ChatChunkChoice(index, delta, logprobs, finish, ids)])
        options = self.body.stream_options
        if options is not None and options.include_usage:
            yield self._chunk([], usage=self.usage(group))

    def _split_chunks(
        self, index: int, splitter: ChoiceSplitter, output: RequestOutput
    ) -> list[ChatCompletionChunk]:
        """The chunks of one delta output split into reasoning, content and tool calls; its
        logprobs and token ids ride on its first chunk."""
        completion = output.outputs[0]
        logprobs = None
        if self.body.logprobs and completion.logprobs:
            logprobs = chat_logprobs(self.names, completion.logprobs)
        ids = token_ids_if(self.body.return_token_ids, completion.token_ids)
        deltas = _deltas(splitter.advance(output))
        if (logprobs is not None or ids) and not deltas:
            deltas.append(ChatDelta())  # text still held back: the tokens' logprobs go now
        chunks = [
            self._chunk(
                [
                    ChatChunkChoice(index, delta)
                    if i
                    else ChatChunkChoice(index, delta, logprobs, token_ids=ids)
                ]
            )
            for i, delta in enumerate(deltas)
        ]
        if output.finished:
            finish = _finish_reason(output.outputs[0], splitter.num_calls)
            chunks.append(self._chunk([ChatChunkChoice(index, ChatDelta(), None, finish)]))
        return chunks


def _deltas(pieces: list[ReasoningPiece | ToolCallPiece]) -> list[ChatDelta]:
    """A chunk's delta per piece: reasoning, content, a call starting, or a call's arguments."""
    deltas = []
    for piece in pieces:
        if piece.kind == "reasoning":
            deltas.append(ChatDelta(reasoning_content=piece.text))
        elif piece.kind == "content":
            deltas.append(ChatDelta(content=piece.text))
        elif piece.kind == "call":
            call = ToolCallDelta(
                piece.index, FunctionCallDelta(piece.text), new_call_id(), "function"
            )
            deltas.append(ChatDelta(tool_calls=[call]))
        else:
            arguments = ToolCallDelta(piece.index, FunctionCallDelta(arguments=piece.text))
            deltas.append(ChatDelta(tool_calls=[arguments]))
    return deltas


def _finish_reason(completion, num_calls: int) -> str | None:
    """``tool_calls`` when the model stopped after calling tools, its own finish reason otherwise."""
    return (
        "tool_calls"
        if num_calls and completion.finish_reason == "stop"
        else completion.finish_reason
    )
