"""``POST /v1/responses``: OpenAI's Responses API over the same chat machinery (template, tools, constraints).

``instructions`` become a system turn and ``input`` (a string, or message, ``function_call`` and
``function_call_output`` items) the conversation; function tools and ``tool_choice`` mean what they
mean for chat, and ``text.format`` is the output constraint (``json_schema`` or ``json_object``).
The answer's ``output`` is a message item for text and a ``function_call`` item per call, in the
order they were generated, after a ``reasoning`` item (its ``reasoning_text``) when the server
splits reasoning (``--reasoning-parser``); ``status`` is ``incomplete`` when ``max_output_tokens`` cut it. Streams
send the named events ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` ... ``response.output_item.done`` (text and arguments deltas as they
are generated; ``response.reasoning_text.delta`` for reasoning), then ``response.completed``
(``response.incomplete`` when cut). Responses are kept in the server's memory unless ``store``
is false (`response_store`): ``previous_response_id`` continues one, and ``GET`` and ``DELETE
/v1/responses/{id}`` read and drop one.
"""

import copy
import time
import uuid
from collections.abc import AsyncIterator

from litestar import Request, Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from spyglass.core.api.chat import TemplateOptions, start_chat
from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import check_finished, given_or, request_attributes
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import RequestGroup, output_kind, unless_disconnected
from spyglass.core.api.reasoning_output import ChoiceSplitter, reasoning_for
from spyglass.core.api.response_store import (
    ResponseStore,
    StoredResponse,
    output_items,
)
from spyglass.core.api.responses_schemas import (
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
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.tools import (
    ToolUse,
    choose_tools,
    function_tool,
    new_call_id,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.reasoning import ReasoningParser, ReasoningPiece
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.core.engine.tool_calls import ToolCallPiece


def input_items(body: ResponsesRequest, store: ResponseStore) -> list[InputItem]:
    """The call's input as items, after the conversation of the response it continues
    (``previous_response_id``: a 400 naming it when that response is not kept)."""
    items = body.input
    if isinstance(items, str):
        items = [InputItem(type="message", role="user", content=items)]
    if body.previous_response_id is None:
        return list(items)
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
    return [*previous.items, *items]


def stores(body: ResponsesRequest, store: ResponseStore) -> bool:
    """Whether the call's response is kept: ``store`` (true when left out, as OpenAI's default)
    where the server keeps responses; ``store: true`` is a 400 where it keeps none."""
    if body.store and not store.capacity:
        raise APIError(
            400,
            "this server keeps no responses: start it with --responses-store-size N",
            "store",
            "unsupported_parameter",
        )
    return body.store is not False and store.capacity > 0


def conversation(instructions: str | None, items: list[InputItem]) -> list[ChatMessage]:
    """The instructions and input items as chat turns; a 400 naming ``input`` for an item that misses a field."""
    turns = [ChatMessage("system", instructions)] if instructions else []
    for item in items:
        if item.type == "message":
            _require(item, "role", "content")
            turns.append(ChatMessage(item.role, _content(item.content)))
        elif item.type == "function_call":
            _require(item, "call_id", "name", "arguments")
            call = ToolCall(id=item.call_id, function=FunctionCall(item.name, item.arguments))
            if turns and turns[-1].role == "assistant":  # calls made in the same turn as its text
                turns[-1].tool_calls = [*(turns[-1].tool_calls or []), call]
            else:
                turns.append(ChatMessage("assistant", None, tool_calls=[call]))
        else:
            _require(item, "call_id", "output")
            turns.append(ChatMessage("tool", _text(item.output), tool_call_id=item.call_id))
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
    )
    response_id = f"resp_{uuid.uuid4().hex}"
    attributes = request_attributes(data, "chat", response_id, serving.model_name, request.headers)
    if data.previous_response_id is not None:  # the turn before, on the trace
        attributes["previous_response_id"] = data.previous_response_id
    reasoning = reasoning_for(serving.reasoning_parser, params, use)
    items = input_items(data, serving.responses)
    kept = items if stores(data, serving.responses) else None
    group = await start_chat(
        serving,
        request,
        conversation(data.instructions, items),
        use,
        params,
        response_id,
        attributes,
        "input",
        template=TemplateOptions(
            reasoning_effort=data.reasoning and data.reasoning.effort, effort_param="reasoning"
        ),
        lora_name=lora_name,
        kind=output_kind(data.stream, reads_deltas=reasoning is not None),
        reasoning=reasoning,
    )
    writer = _ResponseWriter(serving, data, response_id, use, reasoning, kept)
    if data.stream:
        return event_stream(writer.events(group), named=True)
    return Response(await unless_disconnected(request, writer.collect(group)))


@get(
    "/v1/responses/{response_id:str}",
    summary="A stored response (OpenAI Responses API)",
    tags=["openai"],
)
async def retrieve_response(
    response_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """The response as it was returned; a 404 for one the server does not keep."""
    return _stored(serving, response_id).response


@delete(
    "/v1/responses/{response_id:str}",
    summary="Drop a stored response (OpenAI Responses API)",
    tags=["openai"],
    status_code=200,
)
async def delete_response(
    response_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """Drop a kept response: it can no longer be read or continued."""
    _stored(serving, response_id)
    serving.responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


def _stored(serving: ServingContext, response_id: str) -> StoredResponse:
    stored = serving.responses.get(response_id)
    if stored is None:
        raise APIError(404, f"no response {response_id!r} is kept here", "response_id")
    return stored


class _OutputItems:
    """The response's output items, built from the pieces of the generated text; each change is also an event
    (a dict with its ``type``; the writer numbers them)."""

    def __init__(self):
        self.items: list[dict] = []
        self._open: dict | None = None
        self._open_text: list[str] = []
        """The open item's text (or arguments) so far, joined when it closes: a string grown by
        ``+=`` at every token would copy all of a long answer at each."""

    def add(self, piece: ReasoningPiece | ToolCallPiece) -> list[dict]:
        """The events one piece makes: a new item when the kind of output changes, then a delta."""
        events = []
        opening = (
            self._open is None
            or piece.kind == "call"
            or self._open["type"] != _ITEM_TYPES[piece.kind]
        )
        if opening:
            events += self.close("completed")
            events += self._start(piece)
        item, position = self._open, len(self.items) - 1
        if piece.kind in ("reasoning", "content"):
            self._open_text.append(piece.text)
            reasoning = piece.kind == "reasoning"
            events.append(
                {
                    "type": "response.reasoning_text.delta"
                    if reasoning
                    else "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": position,
                    "content_index": 0,
                    "delta": piece.text,
                    **({} if reasoning else {"logprobs": []}),
                }
            )
        elif piece.kind == "arguments":
            self._open_text.append(piece.text)
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": position,
                    "delta": piece.text,
                }
            )
        return events

    def _start(self, piece: ReasoningPiece | ToolCallPiece) -> list[dict]:
        if piece.kind == "reasoning":
            item = {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
                "content": [],
            }
        elif piece.kind == "content":
            item = {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        else:
            name = piece.text if piece.kind == "call" else ""
            item = {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "status": "in_progress",
                "call_id": new_call_id(),
                "name": name,
                "arguments": "",
            }
        self.items.append(item)
        self._open, self._open_text = item, []
        position = len(self.items) - 1
        events = [
            {
                "type": "response.output_item.added",
                "output_index": position,
                "item": copy.deepcopy(item),
            }
        ]
        if piece.kind in ("content", "reasoning"):
            part = (
                {"type": "reasoning_text", "text": ""}
                if piece.kind == "reasoning"
                else {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            )
            item["content"].append(part)
            events.append(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": position,
                    "content_index": 0,
                    "part": copy.deepcopy(item["content"][0]),
                }
            )
        return events

    def close(self, status: str) -> list[dict]:
        """Finish the open item, if any, with ``status`` (``completed``, or ``incomplete`` when cut)."""
        item, self._open = self._open, None
        if item is None:
            return []
        position = len(self.items) - 1
        item["status"] = status
        if item["type"] in ("reasoning", "message"):
            part = item["content"][0]
            part["text"] = "".join(self._open_text)
            reasoning = item["type"] == "reasoning"
            done = {
                "type": "response.reasoning_text.done"
                if reasoning
                else "response.output_text.done",
                "item_id": item["id"],
                "output_index": position,
                "content_index": 0,
                "text": part["text"],
                **({} if reasoning else {"logprobs": []}),
            }
            events = [
                done,
                {
                    "type": "response.content_part.done",
                    "item_id": item["id"],
                    "output_index": position,
                    "content_index": 0,
                    "part": copy.deepcopy(part),
                },
            ]
        else:
            item["arguments"] = "".join(self._open_text)
            events = [
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": position,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            ]
        return [
            *events,
            {
                "type": "response.output_item.done",
                "output_index": position,
                "item": copy.deepcopy(item),
            },
        ]


# The output item each kind of piece belongs to.
_ITEM_TYPES = {
    "reasoning": "reasoning",
    "content": "message",
    "call": "function_call",
    "arguments": "function_call",
}


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
    ):
        self.serving = serving
        self.kept = kept
        """The conversation's input items, when the response is to be stored (None: it is not)."""
        self.model = serving.response_model(body.model)
        self.body = body
        self.id = response_id
        self.use = use
        self.splitter = ChoiceSplitter(reasoning, use, serving.tool_format)
        """The answer's split into reasoning, content and calls (its reasoning tokens counted)."""
        self.created_at = int(time.time())

    def _response(self, items: list[dict], group: RequestGroup | None) -> dict:
        """The response object: in progress, or that of the finished ``group``."""
        status, incomplete, usage = "in_progress", None, None
        if group is not None:
            output = group.latest[0]
            cut = output.outputs[0].finish_reason == "length"
            status = "incomplete" if cut else "completed"
            incomplete = {"reason": "max_output_tokens"} if cut else None
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
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": items,
            "parallel_tool_calls": self.use.parallel,
            "previous_response_id": body.previous_response_id,
            "reasoning": None if body.reasoning is None else {"effort": body.reasoning.effort},
            "store": self.kept is not None,
            # The settings the call ran with (a left-out one: the model's default).
            "temperature": given_or(body.temperature, self.serving.sampling_defaults.temperature),
            "top_p": given_or(body.top_p, self.serving.sampling_defaults.top_p),
            "text": _text_config(body),
            "tool_choice": _tool_choice(body),
            "tools": [_tool(tool) for tool in self.use.tools],
            "truncation": "disabled",
            "usage": usage,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    async def collect(self, group: RequestGroup) -> dict:
        """Run to the end and build the response."""
        items = _OutputItems()

        def split(_: int, delta: RequestOutput) -> None:
            for piece in self.splitter.advance(delta):
                items.add(piece)

        (output,) = await group.final_outputs(split)
        check_finished(output.outputs[0])
        items.close(_item_status(output))
        return self._finished(self._response(items.items, group))

    def _finished(self, response: dict) -> dict:
        """``response``, stored with its conversation when the call asked to keep it."""
        if self.kept is not None:
            conversation = (*self.kept, *output_items(response["output"]))
            self.serving.responses.put(StoredResponse(copy.deepcopy(response), conversation))
        return response

    async def events(self, group: RequestGroup) -> AsyncIterator[tuple[str, dict]]:
        """The Responses API's event sequence, numbered."""
        sequence = 0

        def numbered(event: dict) -> tuple[str, dict]:
            nonlocal sequence
            sequence += 1
            return event["type"], {**event, "sequence_number": sequence - 1}

        yield numbered({"type": "response.created", "response": self._response([], None)})
        yield numbered({"type": "response.in_progress", "response": self._response([], None)})
        items, output = _OutputItems(), None
        async for _, output in group.outputs():
            check_finished(output.outputs[0])
            for piece in self.splitter.advance(output):
                for event in items.add(piece):
                    yield numbered(event)
        for event in items.close(_item_status(output)):
            yield numbered(event)
        response = self._finished(self._response(items.items, group))
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield numbered({"type": kind, "response": response})


def _item_status(output: RequestOutput) -> str:
    return "incomplete" if output.outputs[0].finish_reason == "length" else "completed"


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
