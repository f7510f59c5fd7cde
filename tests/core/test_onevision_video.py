"""LLaVA-OneVision's videos (LLaVA-Video's too): each frame a tower-sized square, its features
pooled 2 x 2, frame after frame, then one ``image_newline``, in a run of ``<video>`` tokens;
checked against transformers' ``LlavaOnevisionForConditionalGeneration`` on a tiny random
checkpoint, beside an image (read whole, as the prompt's only image), through chunked prefill,
preemption and the prefix cache."""

import numpy as np
import pytest
import torch

from spyglass.core.engine.image_preprocess import video_pixel_values
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.engine.video_decode import VideoFrames
from spyglass.core.llm import LLM
from tests.core.test_llava_onevision import hf_onevision  # noqa: F401 (a fixture)
from tests.core.vision_reference import (
    assert_blocks_returned,
    assert_greedy_as_transformers,
    chunked_runs,
    noise_image,
    prefix_cache_runs,
)

GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
PROMPT = "USER: <video>\nWhat happens?\nASSISTANT:"
WITH_IMAGE = "USER: <image>\n<video>\nWhat differs?\nASSISTANT:"


def noise_video(seed: int, frames: int, size=(50, 30)) -> VideoFrames:
    return VideoFrames(tuple(noise_image(seed * 100 + i, size) for i in range(frames)), None)


def hf_frames(processor, video: VideoFrames) -> torch.Tensor:
    """transformers' frames ``[frames, 3, side, side]``: each frame's base tile from the image
    processor (the whole frame resized square, as ``LlavaOnevisionVideoProcessor`` resizes it; it
    wants torchvision)."""
    return torch.stack(
        [
            processor(images=[[frame]], return_tensors="pt")["pixel_values"][0][0]
            for frame in video.frames
        ]
    )


def hf_inputs(processor, token_ids: list[int], video: VideoFrames, image=None) -> dict:
    inputs = {
        "input_ids": torch.tensor([token_ids]),
        "pixel_values_videos": hf_frames(processor, video)[None],
    }
    if image is not None:
        inputs |= processor(images=[[image]], return_tensors="pt")
    return inputs


@pytest.fixture(scope="module")
def onevision(tiny_onevision_dir):
    return LLM(model=str(tiny_onevision_dir), dtype="float32", device="cpu")


def test_frames_are_the_image_processors_base_tiles(onevision, hf_onevision):  # noqa: F811
    video = noise_video(1, 3)
    ours = video_pixel_values(video, onevision.engine.arch.vision)
    assert ours.clip.steps == 3
    torch.testing.assert_close(ours.values, hf_frames(hf_onevision[1], video), atol=1e-5, rtol=0)


def test_the_tower_gives_transformers_video_features(onevision, hf_onevision):  # noqa: F811
    model, processor = hf_onevision
    video = noise_video(2, 4)
    frames = hf_frames(processor, video)
    with torch.no_grad():
        expected = model.model.get_video_features(
            frames[None],
            vision_feature_layer=model.config.vision_feature_layer,
            vision_feature_select_strategy=model.config.vision_feature_select_strategy,
        ).pooler_output[0]
    vision = onevision.engine.arch.vision
    [ours] = onevision.engine.runner.model.encode_images(
        [video_pixel_values(video, vision).values], [(50, 30)], [4]
    )
    assert len(ours) == 4 * vision.video_tokens_per_frame + 1 == 17
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


def test_videos_match_transformers(onevision, hf_onevision):  # noqa: F811
    model, processor = hf_onevision
    video, other, image = noise_video(3, 4), noise_video(4, 1, (20, 90)), noise_image(5, (60, 40))
    prompts = [
        {"prompt": PROMPT, "multi_modal_data": {"video": video}},
        {"prompt": PROMPT, "multi_modal_data": {"video": other}},
        {"prompt": WITH_IMAGE, "multi_modal_data": {"video": video, "image": image}},
    ]
    outputs = onevision.generate(prompts, GREEDY)
    for output, (seen, picture) in zip(outputs, [(video, None), (other, None), (video, image)]):
        inputs = hf_inputs(processor, output.prompt_token_ids, seen, picture)
        assert_greedy_as_transformers(output, model, inputs, 8)
    video_id = onevision.engine.arch.vision.video_token_id
    assert outputs[0].prompt_token_ids.count(video_id) == 4 * 4 + 1
    # The image is the prompt's only one: read on its grid, not as one padded square.
    image_id = onevision.engine.arch.vision.image_token_id
    assert outputs[2].prompt_token_ids.count(image_id) > 16 + 1
    assert_blocks_returned(onevision)


@pytest.mark.parametrize("preempting", [False, True])
def test_videos_through_chunks_and_preemption_match_transformers(
    tiny_onevision_dir,
    hf_onevision,  # noqa: F811
    count_preemptions,
    preempting,
):
    videos = [noise_video(10 + i, frames) for i, frames in enumerate([6, 3, 5])]
    blocks = 8 if preempting else None
    outputs = chunked_runs(
        tiny_onevision_dir, PROMPT, videos, 5, blocks, count_preemptions, 12, "video"
    )
    model, processor = hf_onevision
    for output, video in zip(outputs, videos, strict=True):
        inputs = hf_inputs(processor, output.prompt_token_ids, video)
        assert_greedy_as_transformers(output, model, inputs, 12)


def test_the_prefix_cache_tells_videos_apart(tiny_onevision_dir, hf_onevision):  # noqa: F811
    first = noise_video(20, 3)
    video_id = LLM(model=str(tiny_onevision_dir), device="cpu").engine.arch.vision.video_token_id
    runs = prefix_cache_runs(
        tiny_onevision_dir, PROMPT, video_id, [first, noise_video(21, 3), first], "video"
    )
    model, processor = hf_onevision
    inputs = hf_inputs(processor, runs[2].prompt_token_ids, first)
    assert_greedy_as_transformers(runs[2], model, inputs, 8)


def test_chat_video_parts_render_the_video_token(onevision, hf_onevision):  # noqa: F811
    video = noise_video(30, 2)
    frames = np.stack([np.asarray(frame) for frame in video.frames])
    question = {"type": "text", "text": "What happens?"}
    [output] = onevision.chat(
        [{"role": "user", "content": [{"type": "video", "video": frames}, question]}], GREEDY
    )
    model, processor = hf_onevision
    assert_greedy_as_transformers(
        output, model, hf_inputs(processor, output.prompt_token_ids, video), 8
    )


def test_a_video_too_long_for_the_context_is_refused(onevision):
    frames = onevision.engine.max_model_len // 4 + 1
    long = VideoFrames((noise_image(40),) * frames, None)
    with pytest.raises(
        InvalidRequestError, match=f"1 videos take {4 * frames + 1} tokens"
    ) as error:
        onevision.generate({"prompt": PROMPT, "multi_modal_data": {"video": long}})
    assert error.value.param == "multi_modal_data"
