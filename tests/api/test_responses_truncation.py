"""``truncation: "auto"`` on the Responses API: a conversation too long for the context loses
its oldest whole turns (the answer is the one the kept turns get when sent alone), the span says
how many items went, and the default still refuses it. Through the ``openai`` client."""

import asyncio

import openai
import pytest

from spyglass.core.api.response_truncation import fit_conversation
from spyglass.core.api.responses_schemas import InputItem
from tests.api.conftest import TINY_ARGS

GREEDY = {"model": "tiny", "temperature": 0, "max_output_tokens": 4}
CONTEXT = 160  # tokens: a few of the turns below


def _user(text: str) -> InputItem:
    return InputItem(type="message", role="user", content=text)


def _said(text: str) -> InputItem:
    return InputItem(type="message", role="assistant", content=text)


def _fit(items: list[InputItem], budget: int) -> tuple[list[InputItem], int]:
    async def letters(candidate: list[InputItem]) -> int:
        return sum(len(item.content or item.output or item.arguments or "") for item in candidate)

    return asyncio.run(fit_conversation(items, letters, budget))


def test_whole_turns_go_oldest_first_and_instructions_stay():
    system = InputItem(type="message", role="system", content="S")
    call = InputItem(type="function_call", call_id="c", name="f", arguments="{}")
    output = InputItem(type="function_call_output", call_id="c", output="out")
    items = [system, _user("aaaa"), _said("bbbb"), _user("cc"), call, output, _user("d")]
    assert _fit(items, 100) == (items, 0)  # fits: nothing goes
    # The first turn (question and answer) goes; the call keeps its output.
    assert _fit(items, 12) == ([system, _user("cc"), call, output, _user("d")], 2)
    # Then the second, whole; the last turn always stays, even when it does not fit.
    assert _fit(items, 4) == ([system, _user("d")], 5)
    assert _fit(items, 0) == ([system, _user("d")], 5)


@pytest.fixture(scope="module")
def short_client(tiny_llama_dir, tmp_path_factory):
    from tests.api.conftest import start_server

    args = [*TINY_ARGS, "--max-model-len", str(CONTEXT)]
    server = start_server(str(tiny_llama_dir), tmp_path_factory.mktemp("truncation"), *args)
    yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    server.stop()


def test_a_conversation_over_the_context_loses_its_oldest_turns(short_client):
    turns = []
    for number in range(6):
        turns += [
            {"role": "user", "content": f"Question {number}: " + "tell me more " * 6},
            {"role": "assistant", "content": "Here is more. " * 6},
        ]
    turns.append({"role": "user", "content": "And finally?"})
    with pytest.raises(openai.BadRequestError):  # truncation is disabled by default
        short_client.responses.create(input=turns, **GREEDY)
    cut = short_client.responses.create(input=turns, truncation="auto", **GREEDY)
    assert cut.truncation == "auto"
    assert cut.usage.input_tokens + GREEDY["max_output_tokens"] <= CONTEXT
    # The model saw the last turns whole: the same answer as sending only them.
    kept = next(
        len(turns) - start
        for start in range(0, len(turns), 2)
        if _fits(short_client, turns[start:])
    )
    alone = short_client.responses.create(input=turns[-kept:], store=False, **GREEDY)
    assert (cut.usage.input_tokens, cut.output_text) == (
        alone.usage.input_tokens,
        alone.output_text,
    )
    assert 1 < kept < len(turns)
    # What it was given is kept whole: a continuation truncates again.
    listed = short_client.responses.input_items.list(cut.id, limit=100).data
    assert len(listed) == len(turns)
    follow = short_client.responses.create(
        input="Once more?", previous_response_id=cut.id, truncation="auto", **GREEDY
    )
    assert follow.usage.input_tokens + GREEDY["max_output_tokens"] <= CONTEXT
    # Counted without running: the whole conversation, over the context, and what auto keeps.
    count = lambda **fields: short_client.responses.input_tokens.count(model="tiny", **fields)
    assert count(input=turns).input_tokens > CONTEXT
    assert count(input=turns, truncation="auto").input_tokens == cut.usage.input_tokens


def _fits(client, turns) -> bool:
    try:
        client.responses.create(input=turns, store=False, **GREEDY)
    except openai.BadRequestError:
        return False
    return True
