"""Responses run in the background (``background: true``): the call returns at once, ``GET``
reads the answer so far and then the finished one, a background stream can be resumed, ``POST
.../cancel`` stops one and frees its blocks, and a server that stops cancels what it could not
finish. Through the ``openai`` client."""

import httpx
import openai
import pytest
from litestar.testing import TestClient

from spyglass.core.api.app import create_app
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig

GREEDY = {"model": "tiny", "temperature": 0}
# The random model's greedy answer to this prompt runs on without an end of sequence: only the
# limit, or a cancel, ends it.
LONG = {**GREEDY, "input": "Tell me everything.", "max_output_tokens": 12000}


@pytest.fixture
def client(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0)


def _kv(server) -> dict:
    return httpx.get(f"{server.base_url}/debug/kv", timeout=10).json()


def _all_free(server) -> bool:
    stats = _kv(server)
    return stats["num_requests"] == 0 and stats["num_free_blocks"] == stats["num_blocks"]


def _in_background(server) -> float:
    for line in httpx.get(f"{server.base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("spyglass:responses_in_background "):
            return float(line.split()[1])
    raise AssertionError("spyglass:responses_in_background is not exported")


def test_a_background_response_is_read_back_once_done(client, wait_for):
    foreground = client.responses.create(input="Name a city.", max_output_tokens=8, **GREEDY)
    started = client.responses.create(
        input="Name a city.", max_output_tokens=8, background=True, **GREEDY
    )
    assert (started.background, started.status, started.usage) == (True, "in_progress", None)
    done = wait_for(
        lambda: (r := client.responses.retrieve(started.id)).status != "in_progress" and r
    )
    assert done.background is True and done.status == foreground.status
    assert done.output_text == foreground.output_text
    assert done.usage.output_tokens == foreground.usage.output_tokens
    # Kept like any other: it can be continued.
    follow = client.responses.create(
        input="Another?", previous_response_id=done.id, max_output_tokens=2, **GREEDY
    )
    assert follow.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens


def test_a_cancelled_response_keeps_its_output_so_far_and_frees_its_blocks(
    client, tiny_server, wait_for
):
    started = client.responses.create(background=True, **LONG)
    # While it runs, GET shows the answer growing, and the gauge counts it.
    partial = wait_for(lambda: (r := client.responses.retrieve(started.id)).output_text and r)
    assert partial.status == "in_progress" and _in_background(tiny_server) == 1
    with pytest.raises(openai.BadRequestError) as error:  # not continued before it is done
        client.responses.create(input="And?", previous_response_id=started.id, **GREEDY)
    assert error.value.body["param"] == "previous_response_id"
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and cancelled.output_text.startswith(partial.output_text)
    assert 0 < cancelled.usage.output_tokens < LONG["max_output_tokens"]
    assert client.responses.retrieve(started.id).status == "cancelled"
    assert client.responses.cancel(started.id).status == "cancelled"  # again: the same
    wait_for(lambda: _all_free(tiny_server))
    assert _in_background(tiny_server) == 0


def test_what_cannot_be_cancelled_or_run_in_background(client):
    done = client.responses.create(input="Hi.", max_output_tokens=2, **GREEDY)
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.cancel(done.id)
    assert "not made in the background" in error.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_unknown")
    with pytest.raises(openai.BadRequestError) as error:
        client.responses.create(input="Hi.", background=True, store=False, **GREEDY)
    assert error.value.body["param"] == "background"


def test_a_background_stream_is_the_run_s_events_and_can_be_resumed(client, tiny_server, wait_for):
    whole = list(
        client.responses.create(
            input="Name a city.", max_output_tokens=8, background=True, stream=True, **GREEDY
        )
    )
    assert [event.sequence_number for event in whole] == list(range(len(whole)))
    assert whole[0].type == "response.created" and whole[0].response.background is True
    done = whole[-1].response
    assert client.responses.retrieve(done.id).output_text == done.output_text
    # A client that loses its stream resumes it where it left off; the run went on meanwhile.
    events = client.responses.create(background=True, stream=True, **LONG)
    seen = []
    for event in events:
        seen.append(event)
        if event.type == "response.output_text.delta" and len(seen) > 5:
            break
    events.close()
    response_id = seen[0].response.id
    resumed = client.responses.retrieve(
        response_id, stream=True, starting_after=seen[-1].sequence_number
    )
    first = next(iter(resumed))
    assert first.sequence_number == seen[-1].sequence_number + 1
    assert client.responses.retrieve(response_id).status == "in_progress"
    client.responses.cancel(response_id)
    rest = [first, *resumed]
    assert rest[-1].type == "response.incomplete" and rest[-1].response.status == "cancelled"
    assert [event.sequence_number for event in rest] == list(
        range(first.sequence_number, first.sequence_number + len(rest))
    )
    text = "".join(
        event.delta for event in [*seen, *rest] if event.type == "response.output_text.delta"
    )
    assert text == rest[-1].response.output_text
    # Streamed again once it ended: its last event, whole.
    (last,) = list(client.responses.retrieve(response_id, stream=True))
    assert last.type == "response.incomplete" and last.response.output_text == text
    wait_for(lambda: _all_free(tiny_server))


def test_deleting_a_running_response_cancels_it(client, tiny_server, wait_for):
    started = client.responses.create(background=True, **LONG)
    wait_for(lambda: client.responses.retrieve(started.id).output_text)
    client.responses.delete(started.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(started.id)
    wait_for(lambda: _all_free(tiny_server))


def test_a_stopping_server_cancels_what_its_engine_could_not_finish(tiny_llama_dir):
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    options = ServerOptions(served_model_name="tiny", shutdown_timeout=0.5)
    with TestClient(create_app(config, options)) as http:
        started = http.post("/v1/responses", json={**LONG, "background": True}).json()
        serving = http.app.state.serving
    ended = serving.responses.get(started["id"]).response
    assert ended["status"] == "cancelled" and ended["usage"]["output_tokens"] > 0
    assert serving.background.snapshot(started["id"]) is None
