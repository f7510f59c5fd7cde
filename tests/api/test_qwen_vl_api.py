"""Qwen2.5-VL over HTTP: the official OpenAI client sends images of different shapes (each read
at about its own size, within the server's --mm-processor-kwargs pixel bound) to a server,
streaming and not, and gets the offline API's answers; /tokenize counts their tokens from their
sizes; an image Qwen2-VL cannot read, and a request's own processor options, are 400s."""

import json
import re

import pytest
import requests

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from tests.api.conftest import start_tiny
from tests.api.vision_chat import assert_chats_as_offline
from tests.core.vision_reference import data_url, noise_image

QUESTION = "What differs?"
# The server's bound: 1,024 pixels an image (the checkpoint's processor allows 2,304).
BOUNDS = {"max_pixels": 1024}
# Wide (6 x 2 tokens once resized), tall (2 x 5), and over the most pixels (shrunk to 4 x 3).
IMAGES = [noise_image(1, (50, 20)), noise_image(2, (24, 60)), noise_image(3, (200, 150))]


def messages(*images) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module")
def server(tiny_qwen2_5_vl_dir, tmp_path_factory):
    # float32 as offline: bf16 (auto on some CPUs) may flip a near-tie of the random model.
    options = ["--dtype", "float32", "--mm-processor-kwargs", json.dumps(BOUNDS)]
    started = start_tiny("thread", tiny_qwen2_5_vl_dir, tmp_path_factory.mktemp("qwen"), *options)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(tiny_qwen2_5_vl_dir) -> dict[tuple[int, ...], tuple[str, int]]:
    """Per image selection, the offline API's greedy answer and prompt length."""
    llm = LLM(
        model=str(tiny_qwen2_5_vl_dir),
        dtype="float32",
        device="cpu",
        kv_cache_memory="64MiB",
        mm_processor_kwargs=BOUNDS,
    )
    answers = {}
    for indices in [(0,), (1, 2)]:
        chat = messages(*(IMAGES[i] for i in indices))
        [output] = llm.chat(chat, SamplingParams(temperature=0, max_tokens=8))
        answers[indices] = (output.outputs[0].text, len(output.prompt_token_ids))
    return answers


def test_chat_with_images_answers_as_the_offline_api(server, offline):
    for indices, (text, prompt_tokens) in offline.items():
        chat = messages(*(IMAGES[i] for i in indices))
        assert_chats_as_offline(server, chat, text, prompt_tokens)
    assert offline[(0,)][0] != offline[(1, 2)][0]
    # Decoding and resizing the images is the calls' preprocessing, counted once a call.
    metrics = requests.get(f"{server.base_url}/metrics", timeout=60).text
    count = re.search(r"spyglass:request_preprocess_seconds_count\{[^}]*\} (\S+)", metrics)
    assert float(count.group(1)) >= 4


def test_an_image_too_narrow_is_a_400_naming_the_field(server):
    response = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages(noise_image(4, (2, 500))), "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and "differ at most 200 times" in error["message"]
    # The server still answers.
    assert requests.get(f"{server.base_url}/v1/models", timeout=60).ok


def test_a_requests_own_processor_options_are_a_400(server):
    response = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": messages(IMAGES[0]),
            "max_tokens": 4,
            "mm_processor_kwargs": BOUNDS,
        },
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "mm_processor_kwargs"
