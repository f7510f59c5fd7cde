"""Gemma 3 over HTTP: the official OpenAI client sends one image and three to a server whose
steps take 20 tokens (so prompt chunks stop before images they cannot finish), streaming and
not, and gets the offline API's answers (one chunk a prompt there); /tokenize counts the images'
tokens (newlines joined around them) as the prompt holds them, and /metrics the chunks that
waited for a whole image."""

import re

import pytest
import requests

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from tests.api.conftest import start_tiny
from tests.api.vision_chat import assert_chats_as_offline
from tests.core.vision_reference import data_url, noise_image

IMAGES = [noise_image(1, (50, 20)), noise_image(2, (24, 60)), noise_image(3, (200, 150))]


def messages(*images) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": " What differs?"}]}]


@pytest.fixture(scope="module")
def server(tiny_gemma3_vision_dir, tmp_path_factory):
    # float32 as offline: bf16 (auto on some CPUs) may flip a near-tie of the random model.
    directory = tmp_path_factory.mktemp("gemma3")
    options = ["--dtype", "float32", "--max-num-batched-tokens", "20"]
    started = start_tiny("thread", tiny_gemma3_vision_dir, directory, *options)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(tiny_gemma3_vision_dir) -> dict[int, tuple[str, int, list[float]]]:
    """Per number of images, the offline API's greedy answer, prompt length and logprobs."""
    llm = LLM(
        model=str(tiny_gemma3_vision_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB"
    )
    answers = {}
    for count in (1, 3):
        greedy = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
        [output] = llm.chat(messages(*IMAGES[:count]), greedy)
        completion = output.outputs[0]
        logprobs = [entry.logprob for entry in completion.logprobs]
        answers[count] = (completion.text, len(output.prompt_token_ids), logprobs)
    return answers


def test_chat_with_images_answers_as_the_offline_api(server, offline):
    for count, (text, prompt_tokens, logprobs) in offline.items():
        chat = messages(*IMAGES[:count])
        response = assert_chats_as_offline(server, chat, text, prompt_tokens, logprobs=True)
        served = [entry.logprob for entry in response.choices[0].logprobs.content]
        assert served == pytest.approx(logprobs, abs=1e-4)
    # Three images of 20 tokens each (16 image tokens, "\n\n" and the start and end tokens),
    # the two "\n\n" between images joined into one "\n\n\n\n" token twice.
    assert offline[3][1] - offline[1][1] == 2 * 20 - 2
    assert offline[1][2] != pytest.approx(offline[3][2], abs=1e-3)
    # An image's 16 tokens and the text around them: a 20-token chunk from the prompt's start
    # (or from a cached 16-token block) ends inside one of them and stops before it.
    metrics = requests.get(f"{server.base_url}/metrics", timeout=60).text
    waits = re.search(r"^spyglass:image_chunk_waits_total\{[^}]*\} (\S+)$", metrics, re.M)
    assert waits is not None and float(waits.group(1)) >= 1
