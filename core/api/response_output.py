"""A Responses API answer's output items, built from the pieces of the generated text: a
``reasoning`` item for reasoning, a ``message`` for text, a ``function_call`` per call, in the
order they were generated; and the stream events each change makes. With logprobs asked for, a
message's text carries its tokens' (`PieceLogprobs`)."""

import copy
import uuid

import msgspec

from spyglass.core.api.convert import TokenNames, chat_logprobs
from spyglass.core.api.reasoning_items import encrypted_reasoning
from spyglass.core.api.tools import new_call_id
from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.reasoning import ReasoningPiece
from spyglass.core.engine.tool_calls import ToolCallPiece


class OutputItems:
    """The response's output items, built from the pieces of the generated text; each change is also an event
    (a dict with its ``type``; the writer numbers them). With ``encrypt_reasoning`` a reasoning
    item gains its ``encrypted_content`` when it closes (`reasoning_items`)."""

    def __init__(self, encrypt_reasoning: bool = False):
        self.encrypt_reasoning = encrypt_reasoning
        self.items: list[dict] = []
        self._open: dict | None = None
        self._open_text: list[str] = []
        """The open item's text (or arguments) so far, joined when it closes: a string grown by
        ``+=`` at every token would copy all of a long answer at each."""

    def add(self, piece: ReasoningPiece | ToolCallPiece, logprobs: list[dict] = ()) -> list[dict]:
        """The events one piece makes: a new item when the kind of output changes, then a delta
        (a content piece's with the ``logprobs`` of its tokens)."""
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
            if not reasoning:
                item["content"][0]["logprobs"] += logprobs
            events.append(
                {
                    "type": "response.reasoning_text.delta"
                    if reasoning
                    else "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": position,
                    "content_index": 0,
                    "delta": piece.text,
                    **({} if reasoning else {"logprobs": list(logprobs)}),
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

    def so_far(self) -> list[dict]:
        """A copy of the items, the open one holding its text (or arguments) so far."""
        items = copy.deepcopy(self.items)
        if self._open is not None:
            text, last = "".join(self._open_text), items[-1]
            if last["type"] == "function_call":
                last["arguments"] = text
            else:
                last["content"][0]["text"] = text
        return items

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
            if reasoning and self.encrypt_reasoning:
                item["encrypted_content"] = encrypted_reasoning(part["text"])
            done = {
                "type": "response.reasoning_text.done"
                if reasoning
                else "response.output_text.done",
                "item_id": item["id"],
                "output_index": position,
                "content_index": 0,
                "text": part["text"],
                **({} if reasoning else {"logprobs": copy.deepcopy(part["logprobs"])}),
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


class PieceLogprobs:
    """Which generated tokens' logprobs go with which piece of the answer: each token's with the
    first piece its text went into (a token whose text is held back waits for it), kept only for
    the message's text, as the Responses API gives them (``output_text`` parts' ``logprobs``)."""

    def __init__(self, names: TokenNames):
        self.names = names
        self._pending: list[Logprob] = []

    def split(
        self, logprobs: list[Logprob] | None, pieces: list[ReasoningPiece | ToolCallPiece]
    ) -> list[list[dict]]:
        """Per piece of one delta output, the logprob entries it carries."""
        self._pending += logprobs or []
        if not pieces:
            return []
        tokens, self._pending = self._pending, []
        first = chat_logprobs(self.names, tokens).content if pieces[0].kind == "content" else []
        return [msgspec.to_builtins(first), *([] for _ in pieces[1:])]
