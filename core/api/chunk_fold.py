"""A streamed chat call's chunks added up to the completion object a non-streamed call returns:
what a stored streamed call keeps (`chat_store`)."""

from dataclasses import dataclass, field

from spyglass.core.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatTokenLogprob,
    FunctionCall,
    ToolCall,
    Usage,
)


@dataclass(slots=True)
class _CallSoFar:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _ChoiceSoFar:
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _CallSoFar] = field(default_factory=dict)
    logprobs: list[ChatTokenLogprob] | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None

    def choice(self, index: int) -> ChatChoice:
        calls = [
            ToolCall(id=call.id, function=FunctionCall(call.name, "".join(call.arguments)))
            for call in self.calls.values()
        ]
        text = "".join(self.content)
        message = AssistantMessage(
            None if calls and not text else text,
            tool_calls=calls,
            reasoning_content="".join(self.reasoning) if self.reasoning else None,
        )
        logprobs = ChatLogprobs(self.logprobs) if self.logprobs is not None else None
        choice = ChatChoice(index, message, logprobs, self.finish_reason)
        if self.token_ids is not None:
            choice.token_ids = self.token_ids
        return choice


class ChunkFold:
    """Add up a chat stream's chunks (`add`), then build the completion they make (`completion`)."""

    def __init__(self) -> None:
        self._first: ChatCompletionChunk | None = None
        self._choices: dict[int, _ChoiceSoFar] = {}

    def add(self, chunk: ChatCompletionChunk) -> None:
        """Take one chunk's pieces: text, reasoning, calls' pieces, logprobs, ids, finish reasons."""
        if self._first is None:
            self._first = chunk
        for piece in chunk.choices:
            so_far = self._choices.setdefault(piece.index, _ChoiceSoFar())
            delta = piece.delta
            if delta.content:
                so_far.content.append(delta.content)
            if delta.reasoning_content:
                so_far.reasoning.append(delta.reasoning_content)
            for call in delta.tool_calls or ():
                call_so_far = so_far.calls.setdefault(call.index, _CallSoFar())
                call_so_far.id = call.id or call_so_far.id
                call_so_far.name = call.function.name or call_so_far.name
                call_so_far.arguments.append(call.function.arguments)
            if piece.logprobs is not None and piece.logprobs.content is not None:
                so_far.logprobs = so_far.logprobs or []
                so_far.logprobs.extend(piece.logprobs.content)
            if isinstance(piece.token_ids, list):
                so_far.token_ids = so_far.token_ids or []
                so_far.token_ids.extend(piece.token_ids)
            so_far.finish_reason = piece.finish_reason or so_far.finish_reason

    def completion(self, usage: Usage) -> ChatCompletionResponse:
        """The non-streamed response the chunks added so far make, with ``usage``."""
        first = self._first
        assert first is not None, "a chat stream starts with a role chunk"
        choices = [self._choices[index].choice(index) for index in sorted(self._choices)]
        return ChatCompletionResponse(
            first.id,
            first.created,
            first.model,
            choices,
            usage,
            prompt_token_ids=first.prompt_token_ids,
            service_tier=first.service_tier,
        )
