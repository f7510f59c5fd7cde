"""Qwen2.5-VL's videos over HTTP: the official OpenAI client sends a video part (an mp4 file, or
vLLM's base64 JPEG frames) beside an image, streaming and not, and gets the offline API's
answers for the same bytes; /tokenize counts the video's tokens; a video that is no video, and
more videos than --limit-mm-per-prompt allows, are 400s naming the field, and the server serves
on. Qwen3-VL's: an mp4's frames sampled two a second, at most the server's frame limit, each
step behind the time transformers' processor gives it."""

import base64
import io
import json
import re

import pytest
import requests

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from tests.api.conftest import start_tiny
from tests.api.vision_chat import assert_chats_as_offline
from tests.core.vision_reference import data_url, mp4_bytes, noise_image

QUESTION = "What happens?"
IMAGE = noise_image(1, (50, 20))


def mp4_url(seed: int) -> str:
    """A data URL of a random mp4 (`mp4_bytes`)."""
    return "data:video/mp4;base64," + base64.b64encode(mp4_bytes(seed)).decode()


def jpeg_frames_url(seed: int, frames: int = 4) -> str:
    """vLLM's frames form: ``data:video/jpeg;base64,<frame>,<frame>,...``."""
    chunks = []
    for index in range(frames):
        buffer = io.BytesIO()
        noise_image(seed * 100 + index, (40, 28)).save(buffer, format="JPEG")
        chunks.append(base64.b64encode(buffer.getvalue()).decode())
    return "data:video/jpeg;base64," + ",".join(chunks)


VIDEOS = {"mp4": mp4_url(2), "jpeg frames": jpeg_frames_url(3)}


def messages(video_url: str, with_image: bool = False) -> list[dict]:
    parts = [{"type": "video_url", "video_url": {"url": video_url}}]
    if with_image:
        parts.append({"type": "image_url", "image_url": {"url": data_url(IMAGE)}})
    return [{"role": "user", "content": [*parts, {"type": "text", "text": QUESTION}]}]


@pytest.fixture(scope="module", params=["thread", "process"])
def server(request, tiny_qwen2_5_vl_dir, tmp_path_factory):
    """The server, its engine in its thread or in a process of its own (videos cross over)."""
    options = ["--dtype", "float32", "--limit-mm-per-prompt", json.dumps({"video": 1})]
    log_dir = tmp_path_factory.mktemp("qv")
    started = start_tiny(request.param, tiny_qwen2_5_vl_dir, log_dir, *options)
    yield started
    started.stop()


@pytest.fixture(scope="module")
def offline(tiny_qwen2_5_vl_dir) -> dict[tuple[str, bool], tuple[str, int]]:
    """Per video (and with the image or not), the offline API's greedy answer and prompt length."""
    llm = LLM(model=str(tiny_qwen2_5_vl_dir), dtype="float32", device="cpu")
    answers = {}
    for name, url in VIDEOS.items():
        for with_image in (False, True):
            chat = messages(url, with_image)
            [output] = llm.chat(chat, SamplingParams(temperature=0, max_tokens=8))
            answers[name, with_image] = (output.outputs[0].text, len(output.prompt_token_ids))
    return answers


def test_chat_with_videos_answers_as_the_offline_api(server, offline):
    for (name, with_image), (text, prompt_tokens) in offline.items():
        assert_chats_as_offline(server, messages(VIDEOS[name], with_image), text, prompt_tokens)
    assert len({text for text, _ in offline.values()}) > 1


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:video/mp4;base64," + base64.b64encode(b"not a video").decode(), "not a readable"),
        ("data:image/png;base64,AAAA", "has type 'image/png'"),
        ("https://example.com/a.mp4", "media are not fetched from example.com"),
    ],
)
def test_bad_videos_are_400s_naming_the_field(server, url, message):
    response = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages(url), "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"]
    assert error["param"] == "messages"


def test_more_videos_than_the_limit_are_a_400(server):
    chat = messages(VIDEOS["mp4"])
    chat[0]["content"].insert(0, {"type": "video_url", "video_url": {"url": VIDEOS["mp4"]}})
    response = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": chat, "max_tokens": 4},
        timeout=60,
    )
    assert response.status_code == 400
    assert "at most 1 videos" in response.json()["error"]["message"]
    ok = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages(VIDEOS["mp4"]), "max_tokens": 4},
        timeout=60,
    )
    assert ok.status_code == 200


QWEN3_FRAMES = {"video": {"num_frames": 4}}


@pytest.fixture(scope="module", params=["thread", "process"])
def qwen3_server(request, make_tiny_qwen2_vl, tmp_path_factory):
    """A tiny Qwen3-VL's server reading at most 4 frames of a video file."""
    options = ["--dtype", "float32", "--media-io-kwargs", json.dumps(QWEN3_FRAMES)]
    log_dir = tmp_path_factory.mktemp("q3v")
    started = start_tiny(request.param, make_tiny_qwen2_vl("Qwen3VL"), log_dir, *options)
    yield started
    started.stop()


def test_qwen3_vl_reads_a_video_file_two_frames_a_second_with_their_times(
    qwen3_server, make_tiny_qwen2_vl
):
    import importlib

    from transformers import AutoTokenizer
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    # The module itself: transformers' lazy package hands out a stand-in that wants torchvision.
    hf_video = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
    path = make_tiny_qwen2_vl("Qwen3VL")
    # 24 frames at 8 a second: 6 at 2 a second, of which the server reads 4.
    url = "data:video/mp4;base64," + base64.b64encode(mp4_bytes(5, frames=24)).decode()
    chat = messages(url)
    llm = LLM(model=str(path), dtype="float32", device="cpu", media_io_kwargs=QWEN3_FRAMES)
    [output] = llm.chat(chat, SamplingParams(temperature=0, max_tokens=8))
    prompt_tokens = len(output.prompt_token_ids)
    assert_chats_as_offline(qwen3_server, chat, output.outputs[0].text, prompt_tokens)
    counted = requests.post(
        f"{qwen3_server.base_url}/tokenize",
        json={"messages": chat, "add_generation_prompt": True},
        timeout=60,
    ).json()
    text = AutoTokenizer.from_pretrained(path).decode(counted["tokens"])
    processor = hf_video.Qwen3VLVideoProcessor.from_pretrained(path, max_frames=4)
    indices = processor.sample_frames(VideoMetadata(total_num_frames=24, fps=8.0))
    times = Qwen3VLProcessor.__new__(Qwen3VLProcessor)._calculate_timestamps(indices, 8.0, 2)
    expected = [f"{seconds:.1f}" for seconds in times]
    assert expected == ["0.5", "2.4"]
    assert re.findall(r"<([\d.]+) seconds><\|vision_start\|>", text) == expected
