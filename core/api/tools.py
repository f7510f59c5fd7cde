"""Tool calling for chat: tools into the prompt, ``tool_choice`` into a constraint, generated text into calls.

- ``tool_choice`` ``none`` (or no tools): the tools are left out of the prompt; plain text comes back.
- ``auto``: the tools go into the prompt; the model's text is split into content and calls by the
  tool-call parser plugin (``hermes`` by default), incrementally: streams send a call's name as soon
  as it is written and its arguments as they are generated.
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
from spyglass.core.engine.answer_reading import JSON_CALLS
from spyglass.core.engine.call_streams import answer_calls_stream
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.sampling_params import StructuredOutput
from spyglass.core.engine.tool_calls import (
    ParsedToolCall,
    ToolCallParser,
    ToolCallPiece,
    ToolCallStream,
    calls_schema,
    merge,
)
from spyglass.telemetry import metrics

PROMPTED_FORMAT = "hermes"
"""The tool-call format the system-prompt section for templates without tools asks for."""
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
    strict: frozenset[str] = frozenset()
    """The functions marked ``strict``: with ``auto`` their calls' arguments are held to their
    schemas (`strict_constraint`); ``required`` and forced calls always are."""

    @property
    def active(self) -> bool:
        """Whether tools are offered at all."""
        return self.mode != "none"


def tool_use(body: ChatCompletionRequest) -> ToolUse:
    """A chat request's tool use."""
    tools = [
        function_tool(t.function.name, t.function.description, t.function.parameters)
        for t in body.tools or []
    ]
    strict = frozenset(t.function.name for t in body.tools or [] if t.function.strict)
    choice = body.tool_choice
    if choice is None or isinstance(choice, str):
        return choose_tools(tools, choice, parallel=body.parallel_tool_calls, strict=strict)
    return choose_tools(tools, "forced", choice.function.name)


def function_tool(name: str, description: str | None, parameters: dict | None) -> dict:
    """A function tool in HF's format (what chat templates take)."""
    described = {"name": name, "parameters": parameters or _ANY_OBJECT}
    if description:
        described["description"] = description
    return {"type": "function", "function": described}


def choose_tools(
    tools: list[dict],
    mode: str | None,
    forced: str | None = None,
    parallel: bool = True,
    strict: frozenset[str] = frozenset(),
) -> ToolUse:
    """Tool use with ``mode`` none, auto (the default with tools), required or forced (the function ``forced``);
    a 400 for a choice that names no offered function or asks for calls without tools."""
    if mode is None:
        mode = "auto" if tools else "none"
    if not tools and mode != "none":
        raise APIError(400, "tool_choice needs tools", "tool_choice")
    if mode != "forced":
        return ToolUse(tools, mode, parallel=parallel, strict=strict)
    if forced not in [tool["function"]["name"] for tool in tools]:
        raise APIError(
            400, f"tool_choice names {forced!r}, which is not among the tools", "tool_choice"
        )
    return ToolUse(tools, "forced", forced, parallel=False)


def constraint(use: ToolUse) -> StructuredOutput | None:
    """The JSON schema the output must follow for ``required`` and forced choices; None otherwise."""
    if use.mode not in ("required", "forced"):
        return None
    one_call = calls_schema(
        {
            f["name"]: f["parameters"]
            for f in (tool["function"] for tool in use.tools)
            if use.mode == "required" or f["name"] == use.forced
        }
    )
    schema = {"type": "array", "items": one_call, "minItems": 1} if use.parallel else one_call
    return StructuredOutput("json_schema", schema)


def strict_constraint(use: ToolUse, parser: ToolCallParser) -> StructuredOutput | None:
    """For ``auto`` with ``strict`` functions: the tool-call format's grammar of content and calls,
    the strict functions' arguments held to their schemas (the others' to any object), so that a
    call the model writes always parses and validates, as OpenAI's strict mode promises; None
    otherwise, and a 400 when the parser has no grammar to give."""
    if use.mode != "auto" or not use.strict:
        return None
    grammar = getattr(parser, "strict_grammar", None)
    if grammar is None:
        raise APIError(
            400,
            "strict functions with tool_choice auto need a tool-call parser that constrains its "
            "calls, and this server's has none: leave strict out, or use tool_choice required",
            "tools",
        )
    functions = (tool["function"] for tool in use.tools)
    arguments = {
        f["name"]: f["parameters"] if f["name"] in use.strict else _ANY_OBJECT for f in functions
    }
    return StructuredOutput("grammar", grammar(arguments, use.parallel))


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """The server's tool-call format, as prompts need it: its name (``--tool-call-parser``) and
    its parser (None where no plugin provides it)."""

    name: str = PROMPTED_FORMAT
    parser: ToolCallParser | None = None


DEFAULT_TOOL_FORMAT = ToolFormat()
"""The default server's format: the one its prompts for templates without tools ask for."""


def check_prompted_format(
    use: ToolUse, template_takes_tools: bool, tool_format: ToolFormat
) -> None:
    """A 400 naming ``tools`` when calls left to the model (``auto``) would be asked for in the
    Hermes format (the chat template renders no tools, so the server's section lists them) while
    the server parses another format: every call would come back as content."""
    if use.mode == "auto" and not template_takes_tools and tool_format.name != PROMPTED_FORMAT:
        raise APIError(
            400,
            f"this chat template does not render tools, so they are offered in the "
            f"{PROMPTED_FORMAT} format, which the server's tool-call parser ({tool_format.name}) "
            f"does not read: use tool_choice required or a named function, or a chat template "
            "that renders tools",
            "tools",
        )


def with_prompt_call_ids(messages: list[dict], tool_format: ToolFormat) -> list[dict]:
    """``messages`` with their call ids (of calls and of results alike) as the parser's
    ``prompt_call_id`` writes them for the template, where it has one."""
    rename = getattr(tool_format.parser, "prompt_call_id", None)
    if rename is None:
        return messages
    renamed = []
    for message in messages:
        if message.get("tool_calls"):
            calls = [{**call, "id": rename(call["id"])} for call in message["tool_calls"]]
            message = {**message, "tool_calls": calls}
        if message.get("tool_call_id") is not None:
            message = {**message, "tool_call_id": rename(message["tool_call_id"])}
        renamed.append(message)
    return renamed


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
            written.append(
                {
                    "role": "assistant",
                    "content": "\n".join(filter(None, [message["content"], calls])),
                }
            )
        else:
            written.append(message)
    written = [{k: v for k, v in m.items() if k != "tool_results"} for m in written]
    if not use.active:
        return written
    section = _FALLBACK_PROMPT.format(tools="\n".join(json.dumps(tool) for tool in use.tools))
    if written and written[0]["role"] == "system":
        return [
            {"role": "system", "content": f"{written[0]['content']}\n\n{section}"},
            *written[1:],
        ]
    return [{"role": "system", "content": section}, *written]


def tool_stream(use: ToolUse, tool_format: ToolFormat) -> ToolCallStream | None:
    """The incremental parse of one choice's output: None when it is plain text (no tools, or no parser)."""
    if use.mode in ("required", "forced"):
        return answer_calls_stream(None, use.parallel, use.tools)
    if use.mode == "auto" and tool_format.parser is not None:
        return answer_calls_stream(tool_format.parser, use.parallel, use.tools)
    return None


def count_calls(use: ToolUse, tool_format: ToolFormat, num_calls: int) -> None:
    """Count calls returned to a client by the format they were read in: the parser's with
    ``auto``, ``json`` for required and named calls (the grammar writes them)."""
    if num_calls:
        name = JSON_CALLS if use.mode in ("required", "forced") else tool_format.name
        metrics.TOOL_CALLS.labels(name).inc(num_calls)


class OutputSplitter:
    """Turns one choice's outputs into content and tool-call pieces as they are generated."""

    def __init__(self, use: ToolUse, tool_format: ToolFormat):
        self.use = use
        self.tool_format = tool_format
        self.stream = tool_stream(use, tool_format)
        self.num_calls = 0

    def advance(self, output: RequestOutput) -> list[ToolCallPiece]:
        """The pieces of a delta output (and all that is left once it finished)."""
        return self.feed(output.outputs[0].text, output.finished)

    def feed(self, text: str, finished: bool) -> list[ToolCallPiece]:
        """The pieces of the output's next ``text`` (and all that is left when ``finished``)."""
        if self.stream is None:
            pieces = [ToolCallPiece("content", text)] if text else []
        else:
            pieces = self.stream.feed(text) + (self.stream.finish() if finished else [])
        started = sum(piece.kind == "call" for piece in pieces)
        count_calls(self.use, self.tool_format, started)
        self.num_calls += started
        return merge(pieces)


def new_call_id() -> str:
    """An OpenAI-style tool call id."""
    return f"call_{uuid.uuid4().hex[:24]}"


def response_tool_call(call: ParsedToolCall) -> ToolCall:
    """A parsed call as the response's ``tool_calls`` entry, with a fresh id."""
    return ToolCall(id=new_call_id(), function=FunctionCall(call.name, call.arguments))
