"""Images over HTTP: the official OpenAI and Anthropic clients send images to a LLaVA server (its
engine in a thread, then in a process of its own) and get the offline API's answers."""

import base64
import http.server
import io
import threading

import anthropic
import numpy as np
import openai
import pytest
import requests
from PIL import Image

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from tests.api.conftest import start_tiny

QUESTION = "What is in the picture?"


def png_bytes(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (30, 45, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()


def chat_messages(url: str, detail: str | None = None) -> list[dict]:
    image_url = {"url": url} if detail is None else {"url": url, "detail": detail}
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": image_url},
                {"type": "text", "text": QUESTION},
            ],
        }
    ]


class _Images(http.server.BaseHTTPRequestHandler):
    """Serves ``/<seed>.png`` (`png_bytes`), ``/big.png`` (over the server's 64 KiB limit) and
    ``/moved.png`` (a redirect); anything else is a 404."""

    def do_GET(self):
        if self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "/1.png")
            self.end_headers()
            return
        body = b"\0" * (100 << 10) if self.path == "/big.png" else None
        if body is None and self.path.removesuffix(".png").strip("/").isdigit():
            body = png_bytes(int(self.path.removesuffix(".png").strip("/")))
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        """Quiet."""


@pytest.fixture(scope="module")
def image_host():
    """The base URL of a local HTTP server of images (`_Images`)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module", params=["thread", "process"])
def llava_server(request, tiny_llava_dir, tmp_path_factory):
    # Image URLs are fetched from 127.0.0.1 only (not from "localhost").
    fetching = ["--allowed-media-domains", "127.0.0.1", "--max-media-bytes", "64KiB"]
    fetching += ["--limit-mm-per-prompt", '{"image": 2}']
    fetching += ["--dtype", "float32"]  # as offline: bf16 may flip a near-tie of the random model
    server = start_tiny(request.param, tiny_llava_dir, tmp_path_factory.mktemp("llava"), *fetching)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(llava_server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{llava_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60
    )


@pytest.fixture(scope="module")
def offline_answers(tiny_llava_dir) -> dict[int, tuple[str, int]]:
    """Per image seed, the offline API's greedy answer and prompt length for `chat_messages`."""
    llm = LLM(model=str(tiny_llava_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    answers = {}
    for seed in (1, 2):
        [output] = llm.chat(
            chat_messages(data_url(seed)), SamplingParams(temperature=0, max_tokens=8)
        )
        answers[seed] = (output.outputs[0].text, len(output.prompt_token_ids))
    return answers


def test_chat_with_images_answers_as_the_offline_api(client, offline_answers):
    for seed, (text, prompt_tokens) in offline_answers.items():
        response = client.chat.completions.create(
            model="tiny", messages=chat_messages(data_url(seed)), max_tokens=8, temperature=0
        )
        assert response.choices[0].message.content == text
        assert response.usage.prompt_tokens == prompt_tokens  # the image's tokens count
    assert offline_answers[1][0] != offline_answers[2][0]  # the image, not the text, decides


def test_a_streamed_chat_with_an_image_gives_the_same_answer(client, offline_answers):
    stream = client.chat.completions.create(
        model="tiny",
        messages=chat_messages(data_url(1), detail="auto"),
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == offline_answers[1][0]


def test_messages_with_an_image_block_answer_as_the_offline_api(llava_server, offline_answers):
    client = anthropic.Anthropic(
        base_url=llava_server.base_url, api_key="unused", max_retries=0, timeout=60
    )
    image = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(png_bytes(2)).decode(),
        },
    }
    messages = [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]
    message = client.messages.create(
        model="tiny", messages=messages, max_tokens=8, extra_body={"temperature": 0}
    )
    text, prompt_tokens = offline_answers[2]
    assert message.content[0].text == text
    usage = message.usage  # the prompt: computed afresh, and read from the prefix cache
    assert usage.input_tokens + usage.cache_read_input_tokens == prompt_tokens
    counted = client.messages.count_tokens(model="tiny", messages=messages)
    assert counted.input_tokens == prompt_tokens


@pytest.mark.parametrize(
    ("messages", "param", "says"),
    [
        (chat_messages("https://example.com/1.png"), "messages", "--allowed-media-domains"),
        (chat_messages("ftp://127.0.0.1/1.png"), "messages", "http(s) URL"),
        (chat_messages("data:image/png;base64,@@@"), "messages", "base64"),
        (chat_messages("data:image/png;base64,aGVsbG8="), "messages", "not a readable image"),
        (chat_messages(data_url(1), detail="high"), "messages", "detail"),
    ],
    ids=["host not allowed", "ftp URL", "bad base64", "not an image", "detail high"],
)
def test_bad_images_are_400s_naming_the_field(llava_server, client, messages, param, says):
    response = requests.post(
        f"{llava_server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]
    # The server still answers.
    assert client.models.list().data


def test_a_text_model_refuses_images_naming_messages(tiny_client):
    with pytest.raises(openai.BadRequestError) as error:
        tiny_client.chat.completions.create(
            model="tiny", messages=chat_messages(data_url(1)), max_tokens=4
        )
    assert error.value.body["param"] == "messages"
    assert "vision model" in error.value.body["message"]


def test_an_image_in_an_assistant_turn_is_a_400(llava_server):
    image = {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/png",
            "data": base64.b64encode(png_bytes(3)).decode(),
        },
    }
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [image]},
        {"role": "user", "content": QUESTION},
    ]
    response = requests.post(
        f"{llava_server.base_url}/v1/messages",
        json={"model": "tiny", "messages": messages, "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "user turns" in response.text


def test_images_by_url_from_allowed_hosts_answer_as_data_urls(
    llava_server, client, image_host, offline_answers
):
    text, prompt_tokens = offline_answers[1]
    response = client.chat.completions.create(
        model="tiny", messages=chat_messages(f"{image_host}/1.png"), max_tokens=8, temperature=0
    )
    assert response.choices[0].message.content == text
    assert response.usage.prompt_tokens == prompt_tokens
    anthropic_client = anthropic.Anthropic(
        base_url=llava_server.base_url, api_key="unused", max_retries=0, timeout=60
    )
    image = {"type": "image", "source": {"type": "url", "url": f"{image_host}/1.png"}}
    message = anthropic_client.messages.create(
        model="tiny",
        messages=[{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}],
        max_tokens=8,
        extra_body={"temperature": 0},
    )
    assert message.content[0].text == text


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/missing.png", "HTTP 404"),
        ("/big.png", "65536-byte limit"),
        ("/moved.png", "HTTP 302"),  # a redirect could lead past the allowed hosts
    ],
    ids=["404", "too big", "redirect"],
)
def test_image_urls_that_cannot_be_fetched_are_400s(llava_server, image_host, path, says):
    response = requests.post(
        f"{llava_server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": chat_messages(image_host + path), "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "messages" and says in error["message"]


def test_responses_with_an_input_image_answer_as_the_offline_api(client, offline_answers):
    content = [
        {"type": "input_image", "image_url": data_url(2)},
        {"type": "input_text", "text": QUESTION},
    ]
    response = client.responses.create(
        model="tiny",
        input=[{"role": "user", "content": content}],
        max_output_tokens=8,
        temperature=0,
    )
    text, prompt_tokens = offline_answers[2]
    assert response.output_text == text
    assert response.usage.input_tokens == prompt_tokens


def test_more_images_than_the_limit_are_refused_before_any_is_fetched(llava_server):
    # Three URLs of a host that is not allowed: the count is checked first.
    parts = [
        {"type": "image_url", "image_url": {"url": f"https://example.com/{i}.png"}}
        for i in range(3)
    ]
    response = requests.post(
        f"{llava_server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "at most 2 images" in response.json()["error"]["message"]


def test_embeddings_of_messages_with_an_image_match_the_offline_api(llava_server, tiny_llava_dir):
    messages = chat_messages(data_url(1))
    counted = requests.post(
        f"{llava_server.base_url}/tokenize",
        json={"messages": messages, "add_generation_prompt": False},
        timeout=60,
    ).json()
    response = requests.post(
        f"{llava_server.base_url}/v1/embeddings",
        json={"model": "tiny", "messages": messages},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["prompt_tokens"] == counted["count"]  # the image's tokens count
    llm = LLM(model=str(tiny_llava_dir), dtype="float32", device="cpu", kv_cache_memory="32MiB")
    image = Image.open(io.BytesIO(png_bytes(1)))
    [offline] = llm.embed(
        {"prompt_token_ids": counted["tokens"], "multi_modal_data": {"image": image}}
    )
    np.testing.assert_allclose(body["data"][0]["embedding"], offline.outputs.embedding, atol=1e-5)
