"""Images cut into tiles over HTTP: the official OpenAI and Anthropic clients send images of
different shapes to an Idefics3 server (its engine in a thread, then in a process of its own) and
get the offline API's answers; /tokenize counts every tile's tokens."""

import anthropic
import openai
import pytest
import requests

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from tests.api.conftest import start_tiny
from tests.core.vision_reference import data_url, noise_image

QUESTION = "What differs?"
# A landscape image (3 x 3 tiles), a portrait one (3 x 2) and one of a single tile.
IMAGES = [noise_image(1, (50, 40)), noise_image(2, (30, 50)), noise_image(3, (20, 10))]


def messages(*indices: int) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(IMAGES[i])}} for i in indices]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tiny_idefics3_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("idefics3")
    # float32 as offline: bf16 (auto on some CPUs) may flip a near-tie of the random model.
    started = start_tiny(request.param, tiny_idefics3_dir, log_dir, "--dtype", "float32")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(tiny_idefics3_dir) -> dict[tuple[int, ...], tuple[str, int]]:
    """Per image selection, the offline API's greedy answer and prompt length for `messages`."""
    llm = LLM(model=str(tiny_idefics3_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    answers = {}
    for indices in [(0,), (1, 2)]:
        [output] = llm.chat(messages(*indices), SamplingParams(temperature=0, max_tokens=8))
        answers[indices] = (output.outputs[0].text, len(output.prompt_token_ids))
    return answers


def test_chat_and_responses_with_tiled_images_answer_as_the_offline_api(server, offline):
    client = openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )
    for indices, (text, prompt_tokens) in offline.items():
        response = client.chat.completions.create(
            model="tiny", messages=messages(*indices), max_tokens=8, temperature=0
        )
        assert response.choices[0].message.content == text
        assert response.usage.prompt_tokens == prompt_tokens  # every tile's tokens count
        counted = requests.post(
            f"{server.base_url}/tokenize",
            json={"messages": messages(*indices), "add_generation_prompt": True},
            timeout=60,
        ).json()
        assert counted["count"] == prompt_tokens
    content = [
        {"type": "input_image", "image_url": data_url(IMAGES[0])},
        {"type": "input_text", "text": QUESTION},
    ]
    response = client.responses.create(
        model="tiny",
        input=[{"role": "user", "content": content}],
        max_output_tokens=8,
        temperature=0,
    )
    assert (response.output_text, response.usage.input_tokens) == offline[(0,)]
    assert offline[(0,)][0] != offline[(1, 2)][0]


def test_messages_with_image_blocks_answer_as_the_offline_api(server, offline):
    client = anthropic.Anthropic(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=60
    )
    blocks = []
    for index in (1, 2):
        data = data_url(IMAGES[index]).removeprefix("data:image/png;base64,")
        source = {"type": "base64", "media_type": "image/png", "data": data}
        blocks.append({"type": "image", "source": source})
    response = client.messages.create(
        model="tiny",
        max_tokens=8,
        messages=[{"role": "user", "content": [*blocks, {"type": "text", "text": QUESTION}]}],
        extra_body={"temperature": 0},
    )
    text, prompt_tokens = offline[(1, 2)]
    assert response.content[0].text == text
    usage = response.usage  # the prompt: computed afresh, and read from the prefix cache
    assert usage.input_tokens + usage.cache_read_input_tokens == prompt_tokens


def test_the_choices_of_one_call_run_the_tower_once(server):
    def counter(name: str) -> float | None:
        text = requests.get(f"{server.base_url}/metrics", timeout=30).text
        values = [
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)
        ]
        return sum(values) if values else None

    encoded = counter("spyglass:images_encoded_total")
    assert counter("spyglass:image_cache_hits_total") is not None  # exported, in both layouts
    response = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages(1), "max_tokens": 2, "n": 3},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 3
    # Each choice is an engine request with the image; the others read it from the cache, from
    # the same step, or from the prefix cache's blocks, so the tower ran once at most.
    assert counter("spyglass:images_encoded_total") - encoded <= 1
