"""Qwen3-VL's videos: a file's frames sampled two a second (as ``Qwen3VLVideoProcessor`` samples
them), sized with one pixel budget for all of them (its ``smart_resize``), each step of two
frames behind the text of its time (``<0.5 seconds>``, as ``Qwen3VLProcessor`` writes it) and
between its own vision start and end, read by the tower as an image of its own and placed by
M-RoPE as one; checked against transformers' processor functions and model on a tiny random
checkpoint, beside images, through chunked prefill, preemption and the prefix cache."""

import base64
import importlib
import re
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from spyglass.core.engine.image_preprocess import video_pixel_values
from spyglass.core.engine.mrope_positions import prompt_positions
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.engine.video_decode import VideoFrames, video_from_bytes
from spyglass.core.engine.video_sampling import VideoSampling, model_sampling
from spyglass.core.llm import LLM
from spyglass.core.models import qwen_grid
from tests.core.test_qwen_video import (
    MIXED,
    PROMPT,
    VIDEO,
    HFQwenVideo,
    assert_generations_as_transformers,
    our_video_features,
)
from tests.core.vision_reference import (
    assert_greedy_as_transformers,
    chunked_runs,
    mp4_bytes,
    noise_image,
    prefix_cache_runs,
)

# The module itself: transformers' lazy package hands out a stand-in that wants torchvision.
hf_video = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)


def timed_video(seed: int, frames: int, size=(40, 28), rate: float = 8.0, stride: int = 3):
    """``(video, metadata)``: seeded random frames taken as every ``stride``-th frame of a video
    at ``rate`` a second, and transformers' `VideoMetadata` of them."""
    from transformers.video_utils import VideoMetadata

    indices = list(range(0, frames * stride, stride))
    images = tuple(noise_image(seed * 100 + i, size) for i in range(frames))
    video = VideoFrames(images, rate / stride, tuple(index / rate for index in indices))
    return video, VideoMetadata(total_num_frames=frames * stride, fps=rate, frames_indices=indices)


class HFQwen3Video(HFQwenVideo):
    """transformers' side of a tiny Qwen3-VL with videos: frames sized by the video processor's
    ``smart_resize`` (then resized by Pillow, as here, since its own resize wants torchvision)
    and cut as `HFQwenVideo` cuts them; prompts expanded by ``Qwen3VLProcessor``'s
    ``replace_video_token`` over the chat template's vision start, pad and end (as vLLM
    replaces them)."""

    def __init__(self, path):
        import transformers
        from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

        super().__init__(path)
        self.smart_resize = hf_video.smart_resize
        self.video_processor = hf_video.Qwen3VLVideoProcessor.from_pretrained(path)
        # Frames come sized: this cuts them as they are.
        self.frame_images = transformers.Qwen2VLImageProcessorPil(
            min_pixels=1, max_pixels=10**8, patch_size=4, merge_size=2
        )
        # Its constructor looks its video processor up among transformers' (torchvision's):
        # what replace_video_token reads is set by hand.
        self.processor = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
        self.processor.video_processor = self.video_processor
        self.processor.video_token = "<|video_pad|>"
        self.processor.vision_start_token = "<|vision_start|>"
        self.processor.vision_end_token = "<|vision_end|>"

    def frame_size(self, video: VideoFrames) -> tuple[int, int]:
        """``(width, height)`` the video processor sizes the frames to."""
        width, height = video.frames[0].size
        size = self.video_processor.size
        least, most = size["shortest_edge"], size["longest_edge"]
        resized = self.smart_resize(len(video.frames), height, width, 2, 8, least, most)
        return resized[::-1]

    def video_pixels(self, video: VideoFrames) -> tuple[torch.Tensor, list[int]]:
        size = self.frame_size(video)
        frames = tuple(frame.resize(size, Image.BICUBIC) for frame in video.frames)
        return super().video_pixels(VideoFrames(frames, video.fps))

    def timed_inputs(self, prompt: str, videos: list, images=()) -> dict:
        """The model inputs of ``prompt`` with ``videos`` (``(frames, metadata)`` each) and
        ``images``, its video placeholders expanded by the processor."""
        pixels = [self.video_pixels(video) for video, _ in videos]
        grids = torch.tensor([grid for _, grid in pixels])
        found = {"video_grid_thw": grids, "video_metadata": [meta for _, meta in videos]}
        texts = iter(
            [self.processor.replace_video_token(found, index) for index in range(len(videos))]
        )
        expanded = re.sub(re.escape(VIDEO), lambda _: next(texts), prompt)
        image_inputs = self.images(images=list(images), return_tensors="pt") if images else {}
        counts = iter((image_inputs["image_grid_thw"].prod(-1) // 4).tolist() if images else [])
        ids = []
        for token in self.tokenizer(expanded)["input_ids"]:
            ids += [token] * (next(counts) if token == self.pad else 1)
        input_ids = torch.tensor([ids])
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == self.pad).int() + 2 * (input_ids == self.video_pad),
            "pixel_values_videos": torch.cat([p for p, _ in pixels]),
            "video_grid_thw": grids,
            **image_inputs,
        }


@pytest.fixture(scope="module")
def qwen3(make_tiny_qwen2_vl):
    """(checkpoint directory, transformers' side, our LLM)."""
    path = make_tiny_qwen2_vl("Qwen3VL")
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return path, HFQwen3Video(path), llm


@pytest.mark.parametrize(
    ("total", "rate", "most"), [(24, 12.0, 24), (5, 30.0, 24), (250, 25.0, 24), (90, 30.0, 5)]
)
def test_frames_are_sampled_as_the_processor_samples_them(qwen3, total, rate, most):
    from transformers.video_utils import VideoMetadata

    _, _, llm = qwen3
    sampling = model_sampling(most, llm.engine.arch.vision)
    assert (sampling.fps, sampling.min_frames) == (2.0, 4)
    processor = hf_video.Qwen3VLVideoProcessor(max_frames=min(most, 24))
    expected = processor.sample_frames(VideoMetadata(total_num_frames=total, fps=rate))
    assert sampling.indices(total, rate) == expected.tolist()


@pytest.mark.parametrize(
    ("frames", "size"),
    [(2, (40, 28)), (4, (40, 28)), (5, (30, 30)), (12, (64, 64)), (3, (6, 90)), (8, (200, 20))],
)
def test_frames_are_sized_together_as_smart_resize_sizes_them(qwen3, frames, size):
    _, hf, llm = qwen3
    video = VideoFrames(tuple(noise_image(frames, size) for _ in range(frames)), None)
    vision = llm.engine.arch.vision
    assert qwen_grid.resized_size(*size, vision, frames) == hf.frame_size(video)


def test_a_per_frame_cap_sizes_frames_as_the_processor_caps_them(qwen3, tmp_path):
    import json
    import shutil

    from spyglass.core.loaders.qwen2_vl_config import vision_config

    path, hf, llm = qwen3
    for name in ("config.json", "preprocessor_config.json", "video_preprocessor_config.json"):
        shutil.copy(path / name, tmp_path / name)
    saved = json.loads((path / "video_preprocessor_config.json").read_text())
    capped_config = {**saved, "cap_pixels_per_frame": True, "max_video_tokens": 20}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(capped_config))
    config = json.loads((path / "config.json").read_text())
    capped = vision_config(config, tmp_path, llm.engine.tokenizer)
    assert capped.timed_frames.frame_token_cap == 20
    processor = hf_video.Qwen3VLVideoProcessor.from_pretrained(tmp_path)
    for frames, height, width in [(2, 28, 40), (4, 64, 64), (10, 100, 30), (10, 96, 32)]:
        # Its resize ends in torchvision's: read the size it asks for instead.
        with mock.patch.object(hf_video.BaseVideoProcessor, "resize", lambda *_, size, **__: size):
            sized = processor.resize(
                torch.empty(1, frames, 3, height, width),
                processor.size,
                None,
                factor=8,
                temporal_factor=2,
                cap_pixels_per_frame=processor.cap_pixels_per_frame,
            )
        assert qwen_grid.resized_size(width, height, capped, frames) == (sized.width, sized.height)
        if (height, width) == (96, 32):  # the cap binds: fewer pixels than uncapped
            assert sized.height * sized.width < np.prod(
                hf.frame_size(VideoFrames((noise_image(0, (width, height)),) * frames, None))
            )


def test_video_patches_match_transformers(qwen3):
    _, hf, llm = qwen3
    for frames, size in [(4, (40, 28)), (5, (50, 37)), (12, (64, 64))]:
        video, _ = timed_video(frames, frames, size)
        expected, grid = hf.video_pixels(video)
        ours = video_pixel_values(video, llm.engine.arch.vision)
        assert ours.clip.steps == grid[0]
        torch.testing.assert_close(ours.values, expected, atol=1e-5, rtol=0)


def test_prompts_and_positions_match_the_processor_and_rope_index(qwen3):
    _, hf, llm = qwen3
    videos = [timed_video(1, 5), timed_video(2, 4, (24, 48), rate=29.97, stride=7)]
    images = [noise_image(5, (24, 60))]
    inputs = hf.timed_inputs(MIXED, videos, images)
    vision = llm.engine.arch.vision
    prompt_ids = hf.tokenizer(MIXED)["input_ids"]
    ids, placed = images_in_prompt(
        prompt_ids, images, vision, 4096, "", [video for video, _ in videos]
    )
    assert ids == inputs["input_ids"][0].tolist()
    # Steps of frames 0-3 and 6-9 of 8 a second, and 12 alone; then 0-7 and 14-21 of 29.97.
    stamps = re.findall(r"<([\d.]+) seconds><\|vision_start\|>", hf.tokenizer.decode(ids))
    assert stamps == ["0.2", "0.9", "1.5", "0.1", "0.6"]
    expected, delta = hf.model.model.get_rope_index(
        inputs["input_ids"],
        inputs["mm_token_type_ids"],
        inputs["image_grid_thw"],
        inputs["video_grid_thw"],
    )
    ours = prompt_positions(len(ids), placed, vision)
    np.testing.assert_array_equal(ours.positions, expected[:, 0].numpy())
    assert ours.delta == delta.item()


def test_frames_with_no_times_are_taken_two_a_second(qwen3):
    _, hf, llm = qwen3
    vision = llm.engine.arch.vision
    video = VideoFrames(tuple(noise_image(i, (16, 16)) for i in range(6)), None)
    ids, _ = images_in_prompt([vision.video_token_id], [], vision, 4096, "", [video])
    text = hf.tokenizer.decode(ids)
    # Steps of frames 0-1, 2-3, 4-5 at half a second each: their means.
    assert re.findall(r"<([\d.]+) seconds>", text) == ["0.2", "1.2", "2.2"]


def test_the_tower_gives_transformers_video_features(qwen3):
    _, hf, llm = qwen3
    videos = [timed_video(3, 4)[0], timed_video(4, 3, (20, 44))[0]]
    output = hf.video_features(videos)
    ours = our_video_features(llm, videos)
    expected = [
        torch.cat(per_video, dim=-1)
        for per_video in zip(output.pooler_output, *output.deepstack_features)
    ]
    for mine, theirs in zip(ours, expected, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_videos_match_transformers(qwen3):
    _, hf, llm = qwen3
    cases = [
        (PROMPT, [timed_video(7, 4)], []),
        (PROMPT, [timed_video(8, 5, (50, 20), rate=3.0, stride=1)], []),
        (MIXED, [timed_video(9, 2), timed_video(10, 6, (24, 32), rate=24.0)], [noise_image(3)]),
    ]
    assert_generations_as_transformers(
        llm,
        hf.model,
        [(t, [v for v, _ in timed], i, hf.timed_inputs(t, timed, i)) for t, timed, i in cases],
    )


def test_a_video_file_in_chat_is_sampled_two_frames_a_second(qwen3):
    _, hf, llm = qwen3
    data = mp4_bytes(12, frames=24, size=(48, 32), rate=8)  # 3 seconds: 6 frames
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    part = {"type": "video_url", "video_url": {"url": url}}
    chat = [{"role": "user", "content": [part, {"type": "text", "text": "What happens?"}]}]
    [output] = llm.chat(chat, GREEDY)
    video = video_from_bytes(data, "", VideoSampling(32, 2.0, 4))
    assert len(video.frames) == 6
    assert video.times == tuple(index / 8 for index in [0, 5, 9, 14, 18, 23])
    [expected] = llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": video}}, GREEDY)
    assert output.prompt_token_ids == expected.prompt_token_ids
    assert output.outputs[0].token_ids == expected.outputs[0].token_ids
    stamps = re.findall(r"<([\d.]+) seconds>", hf.tokenizer.decode(output.prompt_token_ids))
    assert stamps == ["0.3", "1.4", "2.6"]


@pytest.mark.parametrize("preempting", [False, True])
def test_videos_through_chunks_and_preemption_match_transformers(
    qwen3, count_preemptions, preempting
):
    path, hf, _ = qwen3
    videos = [
        timed_video(20 + i, frames, size)
        for i, (frames, size) in enumerate([(4, (48, 40)), (5, (50, 20)), (2, (24, 60))])
    ]
    blocks = 16 if preempting else None  # the longest needs 13: preempted several times
    frames = [video for video, _ in videos]
    outputs = chunked_runs(path, PROMPT, frames, 7, blocks, count_preemptions, 12, "video")
    for output, video in zip(outputs, videos, strict=True):
        assert_greedy_as_transformers(output, hf.model, hf.timed_inputs(PROMPT, [video]), 12)


def test_the_prefix_cache_tells_videos_apart(qwen3):
    path, hf, _ = qwen3
    first = timed_video(30, 4)
    opening = hf.tokenizer("<", add_special_tokens=False)["input_ids"][0]
    runs = prefix_cache_runs(
        path, PROMPT, opening, [first[0], timed_video(31, 4)[0], first[0]], "video"
    )
    assert_greedy_as_transformers(runs[2], hf.model, hf.timed_inputs(PROMPT, [first]), 8)


def test_video_refusals_name_the_field(qwen3):
    _, _, llm = qwen3
    single = VideoFrames((noise_image(1, (32, 32)),), None)
    with pytest.raises(InvalidRequestError, match="at least 2 frames") as error:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"video": single}})
    assert error.value.param == "multi_modal_data"
    with pytest.raises(InvalidRequestError, match="video placeholder tokens but no videos"):
        llm.generate({"prompt": PROMPT})
    assert not llm.engine.has_unfinished_requests
