"""Which tokens' logprobs a Responses answer's message carries: each token's go with the first
piece its text went into, held text's included, and only the message's text keeps them (not
reasoning, not a function call's arguments)."""

import pytest

from spyglass.core.api.convert import TokenNames
from spyglass.core.api.response_output import OutputItems, PieceLogprobs
from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.reasoning import ReasoningPiece
from spyglass.core.engine.tool_calls import ToolCallPiece
from spyglass.core.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def names(tiny_llama_dir) -> TokenNames:
    return TokenNames(Tokenizer.from_hf_dir(tiny_llama_dir))


def _tokens(names: TokenNames, text: str) -> list[Logprob]:
    token_ids = names.tokenizer.encode(text, False)
    return [
        Logprob(token_id, -0.5 - i, {token_id: -0.5 - i}) for i, token_id in enumerate(token_ids)
    ]


def _spelled(entries: list[dict]) -> str:
    return "".join(entry["token"] for entry in entries)


def test_only_the_message_text_keeps_its_tokens_logprobs(names):
    split = PieceLogprobs(names)
    reasoning = split.split(_tokens(names, " thinking"), [ReasoningPiece("reasoning", " thinking")])
    assert reasoning == [[]]
    # Held back (a tag may be starting), then let out with the next token's text: both count.
    assert split.split(_tokens(names, " <"), []) == []
    answer = split.split(_tokens(names, "Paris"), [ReasoningPiece("content", " <Paris")])
    assert _spelled(answer[0]) == " <Paris"
    assert answer[0][0]["top_logprobs"][0]["token"] == answer[0][0]["token"]
    # A delta whose text begins a call: its tokens go with the call, and nothing after them.
    call = split.split(
        _tokens(names, "<tool_call>"),
        [ToolCallPiece("call", "get_weather"), ToolCallPiece("arguments", "{")],
    )
    assert call == [[], []]


def test_the_message_part_and_its_events_carry_them(names):
    split, items = PieceLogprobs(names), OutputItems()
    events = []
    for text in ("The", " answer", " is"):
        (piece,) = [ReasoningPiece("content", text)]
        (carried,) = split.split(_tokens(names, text), [piece])
        events += items.add(piece, carried)
    events += items.close("completed")
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    assert [_spelled(event["logprobs"]) for event in deltas] == ["The", " answer", " is"]
    (done,) = [event for event in events if event["type"] == "response.output_text.done"]
    (part,) = items.items[0]["content"]
    assert _spelled(done["logprobs"]) == _spelled(part["logprobs"]) == "The answer is"
