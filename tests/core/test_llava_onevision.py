"""LLaVA-OneVision: LLaVA-NeXT's grid with its features shrunk past ``anyres_max_N`` tiles' worth,
and an image that shares its prompt with others read whole, padded square; checked against
transformers' image processor and ``LlavaOnevisionForConditionalGeneration`` on a tiny random
checkpoint (a SigLIP tower before Qwen2), through chunked prefill."""

import math
import types

import pytest
import torch

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.loaders.hf_loader import load_hf_dir
from spyglass.core.models import anyres
from tests.core.test_llava import PROMPT, TWO_IMAGES
from tests.core.vision_reference import (
    assert_blocks_returned,
    assert_greedy_as_transformers,
    noise_image,
)

GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
# (width, height): a 3 x 3 grid (shrunk), wide, tall, small, a sliver.
SIZES = [(90, 90), (50, 40), (30, 70), (20, 10), (3, 90)]


@pytest.fixture(scope="module")
def hf_onevision(tiny_onevision_dir):
    from transformers import LlavaOnevisionForConditionalGeneration, LlavaOnevisionImageProcessorPil

    model = LlavaOnevisionForConditionalGeneration.from_pretrained(
        tiny_onevision_dir, dtype=torch.float32
    )
    return model.eval(), LlavaOnevisionImageProcessorPil.from_pretrained(tiny_onevision_dir)


def hf_inputs(processor, token_ids: list[int], images: list) -> dict:
    """Our prompt ids with transformers' pixels for one prompt's ``images`` (its processor needs
    torchvision's video processor; its model checks that the prompt has as many image tokens as
    the features it computes)."""
    return {
        "input_ids": torch.tensor([token_ids]),
        **processor(images=[images], return_tensors="pt"),
    }


def test_token_counts_follow_transformers_formula(tiny_onevision_dir):
    from transformers import LlavaOnevisionImageProcessorPil, LlavaOnevisionProcessor

    vision = load_hf_dir(tiny_onevision_dir, torch.float32).arch.vision
    processor = types.SimpleNamespace(
        image_processor=LlavaOnevisionImageProcessorPil.from_pretrained(tiny_onevision_dir),
        num_image_tokens=16,
        vision_aspect_ratio="anyres_max_2",
    )
    processor._get_unpadded_features = types.MethodType(
        LlavaOnevisionProcessor._get_unpadded_features, processor
    )
    for width, height in SIZES + [(200, 30), (31, 33)]:
        expected = LlavaOnevisionProcessor._get_number_of_features(processor, height, width, 32, 32)
        assert anyres.num_image_tokens(width, height, vision) == expected
        assert anyres.num_image_tokens(width, height, vision, alone=False) == 16 + 1
    # 90 x 90 fits 3 x 3 tiles: 12 x 12 features, sqrt(144 / 32) = 2.1 times 2 tiles' worth,
    # shrunk to 5 x 5 (each row and its newline: 30 tokens after the base tile's 16).
    assert math.isclose(math.sqrt(144 / 32), 2.1213, rel_tol=1e-4)
    assert anyres.num_image_tokens(90, 90, vision) == 16 + 5 * 6


@pytest.mark.parametrize("mode", ["RGB", "RGBA"])
def test_tiles_match_the_transformers_processor(tiny_onevision_dir, hf_onevision, mode):
    vision = load_hf_dir(tiny_onevision_dir, torch.float32).arch.vision
    processor = hf_onevision[1]
    images = [noise_image(seed, size, mode) for seed, size in enumerate(SIZES)]
    for image in images:
        expected = processor(images=[[image]], return_tensors="pt")["pixel_values"][0]
        ours = pixel_values(image, vision).values
        torch.testing.assert_close(ours, expected[: len(ours)], atol=1e-5, rtol=0)
    # Two in one prompt: each padded square and read as one tile ([images, tiles, ...]).
    expected = processor(images=[images[1:3]], return_tensors="pt")["pixel_values"]
    for index, image in enumerate(images[1:3]):
        ours = pixel_values(image, vision, alone=False).values
        torch.testing.assert_close(ours, expected[index], atol=1e-5, rtol=0)


def test_prompts_with_one_and_two_images_match_transformers(tiny_onevision_dir, hf_onevision):
    # Chunks of 8 tokens cut through the images' tokens.
    llm = LLM(
        model=str(tiny_onevision_dir), dtype="float32", device="cpu", max_num_batched_tokens=8
    )
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES, start=20)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images]
    prompts.append({"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[:2]}})
    outputs = llm.generate(prompts, GREEDY)
    model, processor = hf_onevision
    for output, used in zip(outputs, [[image] for image in images] + [images[:2]]):
        inputs = hf_inputs(processor, output.prompt_token_ids, used)
        assert_greedy_as_transformers(output, model, inputs, 8)
    image_id = llm.engine.arch.vision.image_token_id
    assert outputs[0].prompt_token_ids.count(image_id) == 16 + 5 * 6
    assert outputs[-1].prompt_token_ids.count(image_id) == 2 * (16 + 1)
    assert_blocks_returned(llm)
