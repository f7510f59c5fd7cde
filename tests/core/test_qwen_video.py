"""Qwen2-VL's and Qwen2.5-VL's videos: frames resized as a video's, every two of them one step of
patches, each step read by the tower as an image of its own, the steps' tokens in one run of
``<|video_pad|>``, and M-RoPE time positions a step apart (Qwen2.5-VL's ``tokens_per_second``
a second apart); checked against transformers' models on tiny random checkpoints, beside images,
through chunked prefill and the prefix cache."""

import base64
import subprocess
import sys

import numpy as np
import pytest
import torch

from spyglass.core.engine.image_preprocess import video_pixel_values
from spyglass.core.engine.mrope_positions import prompt_positions
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.engine.video_decode import VideoFrames, video_from_bytes
from spyglass.core.engine.video_sampling import VideoSampling
from spyglass.core.llm import LLM
from tests.core.test_qwen2_vl import IMAGE, HFQwen
from tests.core.vision_reference import (
    assert_blocks_returned,
    assert_greedy_as_transformers,
    chunked_runs,
    mp4_bytes,
    noise_image,
    prefix_cache_runs,
)

ARCHITECTURES = ["Qwen2VL", "Qwen2_5_VL"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
PROMPT = f"<|im_start|>user\n{VIDEO}What happens?<|im_end|>\n<|im_start|>assistant\n"
MIXED = f"<|im_start|>user\n{VIDEO}then{IMAGE}and{VIDEO}Compare.<|im_end|>\n<|im_start|>assistant\n"


def noise_video(seed: int, frames: int, size=(40, 28), fps: float | None = 8.0) -> VideoFrames:
    """Seeded random frames (each its own noise), at ``fps``. Compared with transformers, a
    video's steps must take no more time positions than its frames' longer side (there
    transformers 5 and Qwen's own count agree): the tiny Qwen2.5-VL's ``tokens_per_second`` is 4,
    so at 8 frames a second a step takes one."""
    return VideoFrames(tuple(noise_image(seed * 100 + i, size) for i in range(frames)), fps)


class HFQwenVideo(HFQwen):
    """`HFQwen` with videos: each frame's patches from transformers' image processor (the tiny
    checkpoint's video processor shares its sizes), interleaved two frames a patch as
    ``Qwen2VLVideoProcessor`` lays them (it wants torchvision)."""

    def __init__(self, path):
        super().__init__(path)
        self.video_pad = self.tokenizer.convert_tokens_to_ids("<|video_pad|>")
        self.frame_images = self.images  # what sizes and cuts each frame

    def video_pixels(self, video: VideoFrames) -> tuple[torch.Tensor, list[int]]:
        """``[patches, values]`` and ``[steps, rows, columns]`` of the video."""
        frames = list(video.frames)
        frames += frames[-1:] * (len(frames) % 2)
        per_frame = [self.frame_images(images=frame, return_tensors="pt") for frame in frames]
        _, rows, cols = per_frame[0]["image_grid_thw"][0].tolist()
        # An image's patch holds its frame twice, [channels, 2, side, side]: take one of each.
        singles = [p["pixel_values"].view(rows * cols, 3, 2, -1)[:, :, 0] for p in per_frame]
        steps = [
            torch.stack(singles[i : i + 2], dim=2).flatten(1) for i in range(0, len(frames), 2)
        ]
        return torch.cat(steps), [len(steps), rows, cols]

    def video_features(self, videos: list[VideoFrames]):
        """transformers' tower output for ``videos`` (``pooler_output``: one tensor per video)."""
        pixels = [self.video_pixels(video) for video in videos]
        with torch.no_grad():
            return self.model.model.get_video_features(
                torch.cat([p for p, _ in pixels]), torch.tensor([grid for _, grid in pixels])
            )

    def video_inputs(self, prompt: str, videos: list[VideoFrames], images=()) -> dict:
        """transformers' model inputs for ``prompt`` with ``videos`` (and ``images``) in order."""
        pixels = [self.video_pixels(video) for video in videos]
        grids = torch.tensor([grid for _, grid in pixels])
        image_inputs = self.images(images=list(images), return_tensors="pt") if images else {}
        counts = {
            self.video_pad: iter((grids.prod(-1) // 4).tolist()),
            self.pad: iter((image_inputs["image_grid_thw"].prod(-1) // 4).tolist())
            if images
            else iter(()),
        }
        ids = []
        for token in self.tokenizer(prompt)["input_ids"]:
            ids += [token] * (next(counts[token]) if token in counts else 1)
        input_ids = torch.tensor([ids])
        inputs = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == self.pad).int() + 2 * (input_ids == self.video_pad),
            "pixel_values_videos": torch.cat([p for p, _ in pixels]),
            "video_grid_thw": grids,
            **image_inputs,
        }
        if "Qwen2_5" in type(self.model).__name__:
            inputs["second_per_grid_ts"] = torch.tensor([2 / (v.fps or 2.0) for v in videos])
        return inputs


def our_video_features(llm: LLM, videos: list[VideoFrames]) -> list[torch.Tensor]:
    """Our tower's output for ``videos``, one tensor per video."""
    vision = llm.engine.arch.vision
    return llm.engine.runner.model.encode_images(
        [video_pixel_values(video, vision).values for video in videos],
        [video.frames[0].size for video in videos],
        [len(video.frames) for video in videos],
    )


@pytest.fixture(scope="module", params=ARCHITECTURES)
def qwen(request, make_tiny_qwen2_vl):
    """(checkpoint directory, transformers' side, our LLM) per architecture."""
    path = make_tiny_qwen2_vl(request.param)
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return path, HFQwenVideo(path), llm


@pytest.mark.parametrize("frames", [1, 2, 5, 6])
def test_video_patches_are_the_frames_two_by_two(qwen, frames):
    _, hf, llm = qwen
    video = noise_video(frames, frames, size=(37, 50))
    expected, grid = hf.video_pixels(video)
    ours = video_pixel_values(video, llm.engine.arch.vision)
    assert ours.clip.steps == grid[0] == (frames + 1) // 2
    torch.testing.assert_close(ours.values, expected, atol=1e-5, rtol=0)


def test_the_tower_gives_transformers_video_features(qwen):
    _, hf, llm = qwen
    videos = [noise_video(1, 4), noise_video(2, 3, size=(20, 44))]
    output = hf.video_features(videos)
    for mine, theirs in zip(our_video_features(llm, videos), output.pooler_output, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_prompt_positions_are_transformers_rope_index(qwen):
    _, hf, llm = qwen
    videos = [noise_video(3, 4), noise_video(4, 6, size=(30, 30), fps=16.0)]  # half a step
    images = [noise_image(5, (24, 60))]
    inputs = hf.video_inputs(MIXED, videos, images)
    vision = llm.engine.arch.vision
    prompt_ids = hf.tokenizer(MIXED)["input_ids"]
    ids, placed = images_in_prompt(prompt_ids, images, vision, 4096, "", videos)
    assert ids == inputs["input_ids"][0].tolist()
    expected, delta = hf.model.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        inputs["image_grid_thw"],
        inputs["video_grid_thw"],
        **(
            {"second_per_grid_ts": inputs["second_per_grid_ts"]} if vision.tokens_per_second else {}
        ),
    )
    ours = prompt_positions(len(ids), placed, vision)
    np.testing.assert_array_equal(ours.positions, expected[:, 0].numpy())
    assert ours.delta == delta.item()


def test_text_after_a_long_video_goes_on_past_its_last_step(qwen):
    _, _, llm = qwen
    vision = llm.engine.arch.vision
    video = noise_video(6, 20, size=(16, 16), fps=1.0)  # 10 steps of 2 x 2 tokens, 2 s each
    ids, placed = images_in_prompt([7, vision.video_token_id, 8], [], vision, 4096, "", [video])
    positions = prompt_positions(len(ids), placed, vision).positions
    per_step = 2 * vision.tokens_per_second if vision.tokens_per_second else 1
    times = np.repeat(1 + per_step * np.arange(10), 4)
    np.testing.assert_array_equal(positions[0, 1:41], times)
    assert (positions[:, 41] == times[-1] + 1).all()


def test_videos_match_transformers(qwen):
    _, hf, llm = qwen
    cases = [
        (PROMPT, [noise_video(7, 4)], []),
        (PROMPT, [noise_video(8, 5, size=(50, 20), fps=3.0)], []),
        (MIXED, [noise_video(9, 2), noise_video(10, 4, size=(24, 32), fps=16.0)], [noise_image(3)]),
    ]
    assert_generations_as_transformers(
        llm, hf.model, [(text, v, i, hf.video_inputs(text, v, i)) for text, v, i in cases]
    )


def assert_generations_as_transformers(llm: LLM, model, cases: list[tuple]) -> None:
    """Each case, (prompt, videos, images, transformers' inputs), generates 8 greedy tokens in one
    batch as transformers does from its inputs, and every block returns to the pool."""
    prompts = [
        {"prompt": text, "multi_modal_data": {"video": videos, "image": images}}
        for text, videos, images, _ in cases
    ]
    outputs = llm.generate(prompts, GREEDY)
    for output, (*_, inputs) in zip(outputs, cases, strict=True):
        assert_greedy_as_transformers(output, model, inputs, 8)
    assert_blocks_returned(llm)


def test_chat_takes_video_parts_as_frames_and_data_urls(qwen):
    _, hf, llm = qwen
    video = noise_video(11, 2, fps=None)  # one step: at time 0 whatever the rate
    frames = np.stack([np.asarray(frame) for frame in video.frames])
    question = {"type": "text", "text": "What happens?"}
    [by_frames] = llm.chat(
        [{"role": "user", "content": [{"type": "video", "video": frames}, question]}], GREEDY
    )
    assert_greedy_as_transformers(by_frames, hf.model, hf.video_inputs(PROMPT, [video]), 8)


@pytest.mark.parametrize("preempting", [False, True])
def test_videos_through_chunks_and_preemption_match_transformers(
    qwen, count_preemptions, preempting
):
    path, hf, _ = qwen
    videos = [
        noise_video(20 + i, frames, size)
        for i, (frames, size) in enumerate([(4, (48, 40)), (5, (50, 20)), (2, (24, 60))])
    ]
    blocks = 16 if preempting else None
    outputs = chunked_runs(path, PROMPT, videos, 7, blocks, count_preemptions, 12, "video")
    for output, video in zip(outputs, videos, strict=True):
        assert_greedy_as_transformers(output, hf.model, hf.video_inputs(PROMPT, [video]), 12)


def test_the_prefix_cache_tells_videos_apart(qwen):
    path, hf, _ = qwen
    first = noise_video(30, 4)
    runs = prefix_cache_runs(
        path, PROMPT, hf.video_pad, [first, noise_video(31, 4), first], "video"
    )
    assert_greedy_as_transformers(runs[2], hf.model, hf.video_inputs(PROMPT, [first]), 8)


def test_video_refusals_name_the_field(qwen):
    _, _, llm = qwen
    video = noise_video(14, 2)
    with pytest.raises(InvalidRequestError, match="1 video placeholders for 2 videos") as error:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": [video, video]}})
    assert error.value.param == "multi_modal_data"
    with pytest.raises(InvalidRequestError, match="video placeholder tokens but no videos"):
        llm.generate({"prompt": PROMPT})
    tall = VideoFrames((noise_image(1, (2, 500)),) * 2, None)
    with pytest.raises(InvalidRequestError, match="differ at most 200 times"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": tall}})
    steps = llm.engine.max_model_len // 36 + 1  # 48 x 48 frames: 36 tokens a step
    long = VideoFrames((noise_image(15, (48, 48)),) * 2 * steps, None)
    with pytest.raises(InvalidRequestError, match=f"1 videos take {36 * steps} tokens"):
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": long}})
    assert not llm.engine.has_unfinished_requests


def test_models_without_videos_refuse_them(make_tiny_llava):
    llm = LLM(model=str(make_tiny_llava("clip")), dtype="float32", device="cpu")
    with pytest.raises(InvalidRequestError, match="reads no videos") as error:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": noise_video(1, 2)}})
    assert error.value.param == "multi_modal_data"


def test_limit_mm_per_prompt_caps_the_videos_of_a_prompt(make_tiny_qwen2_vl):
    path = make_tiny_qwen2_vl("Qwen2VL")
    llm = LLM(model=str(path), device="cpu", limit_mm_per_prompt={"video": 1, "image": 0})
    two_videos = PROMPT.replace(VIDEO, VIDEO * 2)
    two = {"prompt": two_videos, "multi_modal_data": {"video": [noise_video(1, 2)] * 2}}
    with pytest.raises(InvalidRequestError, match="at most 1 videos") as error:
        llm.generate(two)
    assert error.value.param == "multi_modal_data"
    [output] = llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": noise_video(2, 2)}})
    assert output.outputs[0].finish_reason in ("length", "stop")


def test_spans_count_videos_apart_from_images(qwen):
    from spyglass.plugins.tracing.attributes import request_attributes

    _, _, llm = qwen
    media = {"video": [noise_video(40, 2), noise_video(41, 3)], "image": [noise_image(42)]}
    _, token_ids, placed = llm._prompt({"prompt": MIXED, "multi_modal_data": media})
    llm.engine.add_request("traced", token_ids, SamplingParams(max_tokens=1), images=placed)
    attributes = request_attributes(llm.engine.requests["traced"], "tiny")
    assert (attributes["spyglass.request.videos"], attributes["spyglass.request.images"]) == (2, 1)
    assert attributes["spyglass.request.image_tokens"] == sum(p.length for p in placed)
    assert [p.clip is not None for p in placed] == [True, False, True]  # in prompt order
    llm.engine.abort("traced")
    assert_blocks_returned(llm)


def test_spyglass_generate_with_a_video_answers_as_chat(qwen, tmp_path):
    path, _, llm = qwen
    (tmp_path / "clip.mp4").write_bytes(mp4_bytes(50))
    command = [sys.executable, "-m", "spyglass.core.cli.main", "generate", "What happens?",
               "--model", str(path), "--video", str(tmp_path / "clip.mp4"), "--max-tokens", "8",
               "--dtype", "float32", "--device", "cpu", "--num-threads", "1"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    url = "data:video/mp4;base64," + base64.b64encode(mp4_bytes(50)).decode()
    part = {"type": "video_url", "video_url": {"url": url}}
    chat = [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]
    [output] = llm.chat(chat, SamplingParams(temperature=0, max_tokens=8))
    assert result.stdout.strip() == output.outputs[0].text.strip()


def test_media_io_kwargs_caps_the_frames_read_from_a_file(make_tiny_qwen2_vl):
    path = str(make_tiny_qwen2_vl("Qwen2VL"))
    data = mp4_bytes(60, frames=12)
    part = {
        "type": "video_url",
        "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()},
    }
    chat = [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]
    capped = LLM(
        model=path, dtype="float32", device="cpu", media_io_kwargs={"video": {"num_frames": 4}}
    )
    [output] = capped.chat(chat, GREEDY)
    four = video_from_bytes(data, "", VideoSampling(4))
    [expected] = capped.generate({"prompt": PROMPT, "multi_modal_data": {"video": four}}, GREEDY)
    assert output.prompt_token_ids == expected.prompt_token_ids
    assert output.outputs[0].token_ids == expected.outputs[0].token_ids
    [whole] = LLM(model=path, dtype="float32", device="cpu").chat(chat, GREEDY)
    pad = capped.engine.arch.vision.video_token_id
    # 12 frames are 6 steps, 4 are 2: a third of the video tokens.
    assert 3 * output.prompt_token_ids.count(pad) == whole.prompt_token_ids.count(pad)
    with pytest.raises(ValueError, match="media_io_kwargs"):
        LLM(model=path, device="cpu", media_io_kwargs={"video": {"fps": 2}})


def test_prompts_expanded_by_transformers_are_taken_as_they_are(qwen):
    _, hf, llm = qwen
    videos, images = [noise_video(70, 4), noise_video(71, 2, (24, 32))], [noise_image(72)]
    inputs = hf.video_inputs(MIXED, videos, images)
    expanded = inputs["input_ids"][0].tolist()
    media = {"video": videos, "image": images}
    [output] = llm.generate({"prompt_token_ids": expanded, "multi_modal_data": media}, GREEDY)
    assert_greedy_as_transformers(output, hf.model, inputs, 8)
