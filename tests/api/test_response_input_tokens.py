"""``POST /v1/responses/input_tokens`` (the official client's ``responses.input_tokens.count``):
the input tokens a Responses call with the same fields reports, its continued turns and tools
included, counted without running it."""

import openai
import pytest

from tests.api.test_responses_store import GREEDY, UNIT


@pytest.fixture(scope="module")
def client(tiny_compact_server):
    return openai.OpenAI(
        base_url=f"{tiny_compact_server.base_url}/v1", api_key="unused", max_retries=0
    )


def _counted(client, **fields) -> int:
    counted = client.responses.input_tokens.count(model="tiny", **fields)
    assert counted.object == "response.input_tokens"
    return counted.input_tokens


def test_the_count_is_the_calls_input_tokens(client):
    shaped = {"instructions": "Be brief.", "input": "Name a city.", "tools": [UNIT]}
    first = client.responses.create(**shaped, **GREEDY)
    assert _counted(client, **shaped) == first.usage.input_tokens
    assert _counted(client, input="Name a city.") < first.usage.input_tokens  # no tools, no rules
    # What a continuation sends: the turns it continues, then its input.
    follow = {"input": "And another?", "previous_response_id": first.id, "tools": [UNIT]}
    assert (
        _counted(client, **follow) == client.responses.create(**follow, **GREEDY).usage.input_tokens
    )
    conversation = client.conversations.create(items=[{"role": "user", "content": "I am Ada."}])
    within = {"input": "Who am I?", "conversation": conversation.id}
    counted = _counted(client, **within)
    assert counted == client.responses.create(**within, **GREEDY).usage.input_tokens
    with pytest.raises(openai.NotFoundError):
        _counted(client, input="Hi.", conversation="conv_unknown")
    with pytest.raises(openai.BadRequestError) as error:
        client.post(
            "/responses/input_tokens", body={"input": "Hi.", "temperature": 0.5}, cast_to=object
        )
    assert error.value.body["param"] == "temperature"  # not a field of the count
