"""Idefics3 and SmolVLM: images cut into tiles, each behind its row and column token, checked
against transformers' processors and models on tiny random checkpoints, through chunked prefill,
preemption and the prefix cache."""

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.loaders.hf_loader import load_hf_dir
from spyglass.core.models.idefics3_vision import Idefics3VisionEncoder
from tests.core.test_llava import data_url, noise_image

PROMPT = "<|im_start|>User:<image>What is in the picture?<end_of_utterance>\nAssistant:"
TWO_IMAGES = "<|im_start|>User:<image>and<image>Which differ?<end_of_utterance>\nAssistant:"
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
# (width, height): landscape, portrait, square, one tile's worth, a sliver, odd sizes.
SIZES = [(50, 40), (30, 70), (33, 33), (20, 10), (3, 90), (61, 7)]


@pytest.fixture(scope="module")
def tiny_idefics3_dir(make_tiny_idefics3):
    return make_tiny_idefics3("Idefics3")


@pytest.fixture(scope="module")
def hf_idefics3(tiny_idefics3_dir):
    """transformers' model and processor for the tiny checkpoint."""
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    model = Idefics3ForConditionalGeneration.from_pretrained(tiny_idefics3_dir, dtype=torch.float32)
    return model.eval(), AutoProcessor.from_pretrained(tiny_idefics3_dir)


@pytest.fixture(scope="module")
def idefics3(tiny_idefics3_dir):
    return LLM(model=str(tiny_idefics3_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB")


def hf_inputs(processor, prompt: str, images: list):
    return processor(text=prompt, images=[images], return_tensors="pt")


def hf_greedy(hf, prompt: str, images: list, max_tokens: int = 8):
    """transformers' prompt ids, greedy tokens and their logprobs."""
    model, processor = hf
    inputs = hf_inputs(processor, prompt, images)
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=max_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    prompt_ids = inputs["input_ids"][0].tolist()
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    logprobs = [
        torch.log_softmax(score[0].float(), -1)[token].item()
        for score, token in zip(out.scores, tokens)
    ]
    return prompt_ids, tokens, logprobs


def assert_matches_hf(hf, output, prompt: str, images: list, max_tokens: int = 8):
    prompt_ids, tokens, logprobs = hf_greedy(hf, prompt, images, max_tokens)
    assert output.prompt_token_ids == prompt_ids
    completion = output.outputs[0]
    assert completion.token_ids == tokens
    np.testing.assert_allclose([e.logprob for e in completion.logprobs], logprobs, atol=2e-4)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "P"])
def test_tiles_match_the_transformers_processor(make_tiny_idefics3, split, mode):
    from transformers import AutoProcessor

    path = make_tiny_idefics3("Idefics3", split)
    vision = load_hf_dir(path, torch.float32).arch.vision
    image_processor = AutoProcessor.from_pretrained(path).image_processor
    for seed, size in enumerate(SIZES):
        image = noise_image(seed, size, mode)
        ours = pixel_values(image, vision)
        expected = image_processor(images=[[image]], return_tensors="pt", return_row_col_info=True)
        assert (ours.rows, ours.cols) == (expected["rows"][0][0], expected["cols"][0][0])
        torch.testing.assert_close(ours.values, expected["pixel_values"][0], atol=1e-5, rtol=0)


def test_a_prompt_with_an_image_matches_transformers(idefics3, hf_idefics3):
    image = noise_image(1)
    [output] = idefics3.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)
    vision = idefics3.engine.arch.vision
    # 50 x 40 becomes 60 x 48, then 72 x 72: 3 x 3 tiles and the global image, 4 tokens each.
    assert output.prompt_token_ids.count(vision.image_token_id) == 40
    assert_matches_hf(hf_idefics3, output, PROMPT, [image])


def test_images_of_every_shape_match_transformers(idefics3, hf_idefics3):
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES, start=10)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images]
    prompts.append({"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[:2]}})
    outputs = idefics3.generate(prompts, GREEDY)
    for output, used in zip(outputs, [[image] for image in images] + [images[:2]]):
        assert_matches_hf(hf_idefics3, output, output.prompt, used)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) > 1
