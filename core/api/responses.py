"""``POST /v1/responses``: OpenAI's Responses API over the same chat machinery (template, tools, constraints).

``instructions`` become a system turn and ``input`` (a string, or message, ``function_call`` and
``function_call_output`` items) the conversation; function tools and ``tool_choice`` mean what they
mean for chat, and ``text.format`` is the output constraint (``json_schema`` or ``json_object``).
The answer's ``output`` is a message item for text and a ``function_call`` item per call, in the
order they were generated, after a ``reasoning`` item (its ``reasoning_text``) when the server
splits reasoning (``--reasoning-parser``); ``status`` is ``incomplete`` when ``max_output_tokens``
cut it, ``cancelled`` when the server aborted it (stopping). Streams send the named events
``response.created``, ``response.in_progress``, per item ``response.output_item.added`` ...
``response.output_item.done`` (text and arguments deltas as they are generated;
``response.reasoning_text.delta`` for reasoning), then `last_event`. Responses are kept in the
server's memory unless ``store`` is false (`response_store`; `stored_responses` reads, lists,
cancels and drops them): ``previous_response_id`` continues one. With ``background`` the call
returns once its request has started, and the answer is generated with no client waiting
(`background_responses`).
"""

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.chat import TemplateOptions, render_conversation, start_chat
from spyglass.core.api.context import ServingContext
from spyglass.core.api.conversation_store import NOT_FOUND
from spyglass.core.api.convert import TokenNames, check_finished, given_or, request_attributes
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import RequestGroup, output_kind, unless_disconnected
from spyglass.core.api.kept_ids import RESPONSE, new_kept_id
from spyglass.core.api.kept_store import KeptStore
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.reasoning_items import reasoning_of
from spyglass.core.api.reasoning_output import ChoiceSplitter, reasoning_for
from spyglass.core.api.response_output import OutputItems, PieceLogprobs
from spyglass.core.api.response_store import (
    StoredResponse,
    output_items,
    with_ids,
)
from spyglass.core.api.response_truncation import fit_conversation
from spyglass.core.api.responses_schemas import (
    ENCRYPTED_REASONING_INCLUDE,
    LOGPROBS_INCLUDE,
    InputImage,
    InputItem,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from spyglass.core.api.schemas import (
    ChatMessage,
    FunctionCall,
    ImageURL,
    ImageURLPart,
    TextPart,
    ToolCall,
)
from spyglass.core.api.service_tiers import tier_priority, tier_served
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.tools import (
    ToolUse,
    choose_tools,
    function_tool,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.reasoning import ReasoningParser
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput

log = logging.getLogger("spyglass.api")


def own_items(body: ResponsesRequest) -> list[InputItem]:
    """The call's own input as items, each with an id."""
    items = body.input
    if isinstance(items, str):
        items = [InputItem(type="message", role="user", content=items)]
    return with_ids(list(items))


def conversation_id(body: ResponsesRequest) -> str | None:
    """The id of the conversation the call continues (``conversation``, as an id or an object)."""
    named = body.conversation
    return named if isinstance(named, str) or named is None else named.id


def history_items(body: ResponsesRequest, serving: ServingContext) -> list[InputItem]:
    """The items the call continues: a conversation's (``conversation``: a 404 naming it when
    the server does not keep it), or those of the response it continues
    (``previous_response_id``: a 400 naming it when that response is not kept, or still running
    in the background); the two do not combine."""
    named = conversation_id(body)
    if named is not None:
        if body.previous_response_id is not None:
            message = "conversation does not combine with previous_response_id"
            raise APIError(400, message, "conversation")
        return list(serving.conversations.require(named, "conversation", NOT_FOUND).items)
    if body.previous_response_id is None:
        return []
    if serving.background.snapshot(body.previous_response_id) is not None:
        raise APIError(
            400,
            f"previous_response_id {body.previous_response_id!r} is still being generated in "
            "the background: continue it once GET /v1/responses/{id} says it is completed",
            "previous_response_id",
        )
    store = serving.responses
    previous = store.get(body.previous_response_id)
    if previous is None:
        reason = (
            f"is not kept here (unknown, deleted, or older than the last {store.capacity} "
            "responses this server keeps)"
            if store.capacity
            else "cannot be continued: this server keeps no responses (--responses-store-size 0)"
        )
        raise APIError(
            400,
            f"previous_response_id {body.previous_response_id!r} {reason}",
            "previous_response_id",
            "previous_response_not_found",
        )
    return list(previous.conversation)


def stores(body: ResponsesRequest, store: KeptStore) -> bool:
    """Whether the call's response is kept: ``store`` (true when left out, as OpenAI's default)
    where the server keeps responses; ``store: true`` is a 400 where it keeps none, as is
    ``background`` with a response that is not kept."""
    if body.store and not store.capacity:
        raise APIError(
            400,
            "this server keeps no responses: start it with --responses-store-size N",
            "store",
            "unsupported_parameter",
        )
    kept = body.store is not False and store.capacity > 0
    if body.background and not kept:
        reason = "with store: false" if store.capacity else "on a server that keeps no responses"
        raise APIError(
            400,
            f"a background response is read back once it is done, so it cannot run {reason}",
            "background",
        )
    return kept


def conversation(instructions: str | None, items: list[InputItem]) -> list[ChatMessage]:
    """The instructions and input items as chat turns; a 400 naming ``input`` for an item that misses a field."""
    turns = [ChatMessage("system", instructions)] if instructions else []
    thought = None  # a reasoning item's text, for the assistant turn after it
    for item in items:
        if item.type == "reasoning":
            thought = reasoning_of(item)
            continue
        if thought is not None and item.role != "assistant" and item.type != "function_call":
            # An answer that reasoned and said nothing: its turn holds the reasoning alone.
            turns.append(ChatMessage("assistant", "", reasoning_content=thought))
            thought = None
        if item.type == "message":
            _require(item, "role", "content")
            turns.append(ChatMessage(item.role, _content(item.content)))
            if item.role == "assistant":
                turns[-1].reasoning_content, thought = thought, None
        elif item.type == "function_call":
            _require(item, "call_id", "name", "arguments")
            call = ToolCall(id=item.call_id, function=FunctionCall(item.name, item.arguments))
            if turns and turns[-1].role == "assistant" and thought is None:
                # calls made in the same turn as its text
                turns[-1].tool_calls = [*(turns[-1].tool_calls or []), call]
            else:
                turns.append(ChatMessage("assistant", None, tool_calls=[call]))
                turns[-1].reasoning_content, thought = thought, None
        else:
            _require(item, "call_id", "output")
            turns.append(ChatMessage("tool", _text(item.output), tool_call_id=item.call_id))
    if thought is not None:  # the last answer reasoned and said nothing
        turns.append(ChatMessage("assistant", "", reasoning_content=thought))
    return turns


def _require(item: InputItem, *fields: str) -> None:
    missing = [field for field in fields if getattr(item, field) is None]
    if missing:
        raise APIError(400, f"a {item.type} input item needs {', '.join(missing)}", "input")


def _text(content) -> str:
    return content if isinstance(content, str) else "\n".join(part.text for part in content)


def _content(content) -> str | list[TextPart | ImageURLPart]:
    """A message item's content in the chat API's terms: text, or parts when it holds images."""
    if isinstance(content, str) or not any(isinstance(p, InputImage) for p in content):
        return _text(content)
    return [
        ImageURLPart(ImageURL(part.image_url))
        if isinstance(part, InputImage)
        else TextPart(part.text)
        for part in content
    ]


def tool_use(body: ResponsesRequest) -> ToolUse:
    """Function tools and ``tool_choice`` in the chat API's terms; a 400 for built-in tools."""
    tools = []
    for tool in body.tools or []:
        if tool.type != "function":
            raise APIError(
                400,
                f"`{tool.type}` tools are not supported by this server, only function tools",
                "tools",
                "unsupported_parameter",
            )
        if tool.name is None:
            raise APIError(400, "a function tool needs a name", "tools")
        tools.append(function_tool(tool.name, tool.description, tool.parameters))
    strict = frozenset(tool.name for tool in body.tools or [] if tool.strict)
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        parallel = body.parallel_tool_calls is not False
        return choose_tools(tools, choice, parallel=parallel, strict=strict)
    return choose_tools(tools, "forced", choice.name)


def wants_logprobs(body: ResponsesRequest) -> bool:
    """Whether the message's text carries its tokens' logprobs: ``include`` asks for them, or
    ``top_logprobs`` for their alternatives."""
    return LOGPROBS_INCLUDE in (body.include or ()) or bool(body.top_logprobs)


def text_format(body: ResponsesRequest) -> StructuredOutput | None:
    """``text.format`` as the output constraint."""
    spec = body.text.format if body.text else None
    if isinstance(spec, TextFormatJsonSchema):
        return StructuredOutput("json_schema", spec.schema_)
    if isinstance(spec, TextFormatJsonObject):
        return StructuredOutput("json_object")
    return None


@post(
    "/v1/responses",
    summary="Create a response (OpenAI Responses API)",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ResponsesRequest},
)
async def create_response(
    data: JSONBody[ResponsesRequest], request: Request, serving: NamedDependency[ServingContext]
) -> Response:
    """OpenAI's Responses endpoint; ``stream=true`` answers with its named server-sent events."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    use = tool_use(data)
    defaults = serving.sampling_defaults
    params = SamplingParams(
        temperature=given_or(data.temperature, defaults.temperature),
        top_p=given_or(data.top_p, defaults.top_p),
        top_k=defaults.top_k,
        min_p=defaults.min_p,
        repetition_penalty=defaults.repetition_penalty,
        max_tokens=given_or(data.max_output_tokens, defaults.max_tokens),
        structured_output=text_format(data),
        logprobs=(data.top_logprobs or 0) if wants_logprobs(data) else None,
        priority=tier_priority(data.service_tier, 0, serving.orders_by_priority),
    )
    response_id = new_kept_id(RESPONSE, serving.options.response_id_tag)
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    if data.previous_response_id is not None:  # the turn before, on the trace
        attributes["previous_response_id"] = data.previous_response_id
    if conversation_id(data) is not None:  # the conversation's turns link up in the trace list
        attributes["conversation_id"] = conversation_id(data)
    if data.background:
        attributes["background"] = True
    reasoning = reasoning_for(serving.reasoning_parser, params, use)
    own = own_items(data)
    items = [*history_items(data, serving), *own]
    kept = items if stores(data, serving.responses) else None
    template = response_template(data)
    if data.truncation == "auto":
        items, dropped = await fitted_items(serving, data, items, use, template)
        if dropped:  # what the model did not see, on the trace
            attributes["truncated_items"] = dropped
    group = await start_chat(
        serving,
        request,
        conversation(data.instructions, items),
        use,
        params,
        response_id,
        attributes,
        "input",
        template=template,
        lora_name=lora_name,
        # Read delta by delta: a background run while it runs (GET), logprobs by their pieces.
        kind=output_kind(
            data.stream,
            reads_deltas=reasoning is not None or data.background or wants_logprobs(data),
        ),
        reasoning=reasoning,
    )
    writer = _ResponseWriter(serving, data, response_id, use, reasoning, kept, own)
    if data.background:
        run = serving.background.start(
            response_id, lambda record: writer.run_in_background(group, record), writer.so_far
        )
        if data.stream:  # the run's events; the run goes on if the client leaves
            return event_stream(run.follow(), named=True)
        return Response(writer.so_far())
    if data.stream:
        return event_stream(writer.events(group), named=True)
    return Response(await unless_disconnected(request, writer.collect(group)))


def response_template(body: ResponsesRequest) -> TemplateOptions:
    """How the call's conversation is rendered: its ``reasoning.effort`` for templates that read it."""
    effort = body.reasoning and body.reasoning.effort
    return TemplateOptions(reasoning_effort=effort, effort_param="reasoning")


async def fitted_items(
    serving: ServingContext,
    body: ResponsesRequest,
    items: list[InputItem],
    use: ToolUse,
    template: TemplateOptions,
) -> tuple[list[InputItem], int]:
    """``truncation: "auto"``: the items whose prompt fits the context beside the answer, and
    how many were dropped (`fit_conversation`)."""

    async def count_tokens(candidate: list[InputItem]) -> int:
        turns = conversation(body.instructions, candidate)
        _, prompt, _ = await render_conversation(serving, turns, use, "input", template)
        return len(await encode_text(serving, prompt, "input", False, add_special_tokens=False))

    budget = serving.max_model_len - (body.max_output_tokens or 1)
    return await fit_conversation(items, count_tokens, budget)


class _ResponseWriter:
    """Builds the response, or its stream of events, for one call."""

    def __init__(
        self,
        serving: ServingContext,
        body: ResponsesRequest,
        response_id: str,
        use: ToolUse,
        reasoning: ReasoningParser | None,
        kept: list[InputItem] | None = None,
        own: Sequence[InputItem] = (),
    ):
        self.serving = serving
        self.kept = kept
        """The conversation's input items, when the response is to be stored (None: it is not)."""
        self.own = own
        """The call's own input items: a conversation it continues gets them with its output."""
        self.model = serving.response_model(body.model)
        self.body = body
        self.id = response_id
        self.use = use
        self.splitter = ChoiceSplitter(reasoning, use, serving.tool_format)
        """The answer's split into reasoning, content and calls (its reasoning tokens counted)."""
        self.items = OutputItems(ENCRYPTED_REASONING_INCLUDE in (body.include or ()))
        self._sequence = 0
        """The stream events numbered so far (``sequence_number``)."""
        self.logprobs = (
            PieceLogprobs(TokenNames(serving.tokenizer)) if wants_logprobs(body) else None
        )
        """Where the tokens' logprobs go, when the call asked for them."""
        self.created_at = int(time.time())

    def _add(self, delta: RequestOutput) -> list[dict]:
        """The events of one delta output: its pieces, the message's text with its tokens' logprobs."""
        pieces = self.splitter.advance(delta)
        if self.logprobs is None:
            return [event for piece in pieces for event in self.items.add(piece)]
        carried = self.logprobs.split(delta.outputs[0].logprobs, pieces)
        return [
            event
            for piece, logprobs in zip(pieces, carried)
            for event in self.items.add(piece, logprobs)
        ]

    def _response(
        self,
        items: list[dict],
        group: RequestGroup | None,
        ended: str | None = None,
        error: dict | None = None,
    ) -> dict:
        """The response object: in progress, or that of ``group`` once it ended: as its finish
        reason says, or as ``ended`` says (``cancelled``, ``failed`` with ``error``)."""
        status, incomplete, usage = "in_progress", None, None
        if group is not None:
            output = group.latest[0]
            reason = output.outputs[0].finish_reason
            cut = reason == "length"
            # Aborted by the server (stopping, its engine draining): ``cancelled``, not an answer.
            status = ended or _STATUSES.get(reason, "completed")
            incomplete = {"reason": "max_output_tokens"} if cut and not ended else None
            num_input, num_output = len(output.prompt_token_ids), group.num_tokens[0]
            usage = {
                "input_tokens": num_input,
                "input_tokens_details": {"cached_tokens": output.num_cached_tokens},
                "output_tokens": num_output,
                "output_tokens_details": {"reasoning_tokens": self.splitter.reasoning_tokens},
                "total_tokens": num_input + num_output,
            }
        body = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": bool(body.background),
            "error": error,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": items,
            "parallel_tool_calls": self.use.parallel,
            "previous_response_id": body.previous_response_id,
            "conversation": None if body.conversation is None else {"id": conversation_id(body)},
            "reasoning": None if body.reasoning is None else {"effort": body.reasoning.effort},
            "store": self.kept is not None,
            # The settings the call ran with (a left-out one: the model's default).
            "temperature": given_or(body.temperature, self.serving.sampling_defaults.temperature),
            "top_logprobs": body.top_logprobs or 0,
            "top_p": given_or(body.top_p, self.serving.sampling_defaults.top_p),
            "text": _text_config(body),
            "tool_choice": _tool_choice(body),
            "tools": [_tool(tool) for tool in self.use.tools],
            "truncation": body.truncation or "disabled",
            "service_tier": tier_served(body.service_tier) or "default",
            "usage": usage,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    async def collect(self, group: RequestGroup) -> dict:
        """Run to the end and build the response."""
        items = self.items
        (output,) = await group.final_outputs(lambda _, delta: self._add(delta))
        check_finished(output.outputs[0])
        items.close(_item_status(output))
        return self._finished(self._response(items.items, group))

    def so_far(self) -> dict:
        """The response while it is generated in the background: the output so far."""
        return self._response(self.items.so_far(), None)

    async def run_in_background(
        self, group: RequestGroup, record: Callable[[tuple[str, dict]], None]
    ) -> None:
        """Run to the end with no client waiting, ``record``-ing each event of its stream, and
        keep the response however it ends: completed or incomplete, ``cancelled`` (its engine
        request aborted) with the output so far, or ``failed`` with the reason."""
        try:
            async for event in self.events(group):
                record(event)
        except asyncio.CancelledError:
            self._end(group, record, "cancelled")
        except APIError as failure:
            error = {"code": failure.code or "server_error", "message": failure.message}
            self._end(group, record, "failed", error)
        except Exception as failure:  # kept as the response's error, not lost with the task
            log.exception("background response %s failed", self.id)
            error = {"code": "server_error", "message": f"{type(failure).__name__}: {failure}"}
            self._end(group, record, "failed", error)

    def _end(
        self,
        group: RequestGroup,
        record: Callable[[tuple[str, dict]], None],
        status: str,
        error: dict | None = None,
    ) -> None:
        """Close the open item (cut short), keep the response as ``status`` says, and record the
        events that say so (`last_event`'s last)."""
        for event in self.items.close("incomplete"):
            record(self._numbered(event))
        response = self._finished(self._response(self.items.items, group, status, error))
        record(self._numbered({"type": last_event(response), "response": response}))

    def _finished(self, response: dict) -> dict:
        """``response``, stored with its input items when the call asked to keep it; a
        conversation it continues gets its input and output items once it is answered."""
        if self.kept is not None:
            stored = StoredResponse(copy.deepcopy(response), tuple(self.kept))
            self.serving.responses.put(response["id"], stored)
        named = conversation_id(self.body)
        conversation = None if named is None else self.serving.conversations.get(named)
        if conversation is not None and response["status"] in ("completed", "incomplete"):
            conversation.items.extend([*self.own, *output_items(response["output"])])
        return response

    def _numbered(self, event: dict) -> tuple[str, dict]:
        """``event`` as a named stream event, with the next ``sequence_number``."""
        self._sequence += 1
        return event["type"], {**event, "sequence_number": self._sequence - 1}

    async def events(self, group: RequestGroup) -> AsyncIterator[tuple[str, dict]]:
        """The Responses API's event sequence, numbered."""
        numbered = self._numbered
        yield numbered({"type": "response.created", "response": self._response([], None)})
        yield numbered({"type": "response.in_progress", "response": self._response([], None)})
        items, output = self.items, None
        async for _, output in group.outputs():
            check_finished(output.outputs[0])
            for event in self._add(output):
                yield numbered(event)
        for event in items.close(_item_status(output)):
            yield numbered(event)
        response = self._finished(self._response(items.items, group))
        yield numbered({"type": last_event(response), "response": response})


def last_event(response: dict) -> str:
    """The event a stream ends with: ``response.completed``, ``response.failed``, or
    ``response.incomplete`` for an answer cut short (by its limit, or ``cancelled``: the
    Responses API has no event of its own for that; the response's ``status`` says which)."""
    status = response["status"]
    return f"response.{status}" if status in ("completed", "failed") else "response.incomplete"


# A response's status by its request's finish reason, where it is not ``completed``.
_STATUSES = {"length": "incomplete", "abort": "cancelled"}


def _item_status(output: RequestOutput) -> str:
    cut = output.outputs[0].finish_reason in _STATUSES
    return "incomplete" if cut else "completed"


def _text_config(body: ResponsesRequest) -> dict:
    spec = body.text.format if body.text else None
    if isinstance(spec, TextFormatJsonSchema):
        described = {
            "type": "json_schema",
            "name": spec.name,
            "schema": spec.schema_,
            "strict": bool(spec.strict),
        }
        return {
            "format": {
                **described,
                **({"description": spec.description} if spec.description else {}),
            }
        }
    return {"format": {"type": "json_object" if isinstance(spec, TextFormatJsonObject) else "text"}}


def _tool_choice(body: ResponsesRequest):
    choice = body.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else {"type": "function", "name": choice.name}


def _tool(tool: dict) -> dict:
    function = tool["function"]
    return {
        "type": "function",
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function["parameters"],
        "strict": False,
    }
