"""LLaVA-NeXT: images fitted into the best grid resolution, cut into tiles, their features
unpadded and each row ended by the learned newline; checked against transformers' processor and
``LlavaNextForConditionalGeneration`` on a tiny random checkpoint, through chunked prefill and
preemption."""

import pytest
import torch

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.loaders.hf_loader import load_hf_dir
from tests.core.test_llava import PROMPT, TWO_IMAGES
from tests.core.vision_reference import (
    assert_greedy_as_transformers,
    chunked_runs,
    noise_image,
)

GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
# (width, height): wide, tall, square, small, slivers both ways, odd sizes.
SIZES = [(50, 40), (30, 70), (33, 33), (20, 10), (3, 90), (90, 4), (61, 7)]


@pytest.fixture(scope="module")
def hf_next(tiny_llava_next_dir):
    """transformers' model and processor for the tiny checkpoint."""
    from transformers import (
        AutoTokenizer,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessorPil,
        LlavaNextProcessor,
    )

    model = LlavaNextForConditionalGeneration.from_pretrained(
        tiny_llava_next_dir, dtype=torch.float32
    )
    processor = LlavaNextProcessor(
        LlavaNextImageProcessorPil.from_pretrained(tiny_llava_next_dir),
        AutoTokenizer.from_pretrained(tiny_llava_next_dir),
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )
    return model.eval(), processor


@pytest.fixture(scope="module")
def llava_next(tiny_llava_next_dir):
    return LLM(
        model=str(tiny_llava_next_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB"
    )


def assert_matches_hf(hf, output, prompt: str, images: list, max_tokens: int = 8):
    model, processor = hf
    inputs = processor(text=prompt, images=images, return_tensors="pt")
    assert_greedy_as_transformers(output, model, inputs, max_tokens)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_tiles_match_the_transformers_processor(tiny_llava_next_dir, hf_next, mode):
    vision = load_hf_dir(tiny_llava_next_dir, torch.float32).arch.vision
    for seed, size in enumerate(SIZES):
        image = noise_image(seed, size, mode)
        ours = pixel_values(image, vision)
        expected = hf_next[1].image_processor(images=image, return_tensors="pt")
        assert expected["image_sizes"][0].tolist() == [size[1], size[0]]
        torch.testing.assert_close(ours.values, expected["pixel_values"][0], atol=1e-5, rtol=0)


def test_images_of_every_shape_match_transformers(llava_next, hf_next):
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES, start=10)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images]
    prompts.append({"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[:2]}})
    outputs = llava_next.generate(prompts, GREEDY)
    for output, used in zip(outputs, [[image] for image in images] + [images[:2]]):
        assert_matches_hf(hf_next, output, output.prompt, used)
    # A wide 50 x 40 image: the base tile's 16 tokens, then its 64 x 64 grid's 8 x 8 features
    # less 1 padding row top and bottom, each of the 6 rows ended by the newline: 16 + 6 * 9.
    image_id = llava_next.engine.arch.vision.image_token_id
    assert outputs[0].prompt_token_ids.count(image_id) == 70
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) > 1


@pytest.mark.parametrize("preempting", [False, True], ids=["chunked", "chunked+preempted"])
def test_images_split_across_chunks_and_preemptions_match_transformers(
    tiny_llava_next_dir, hf_next, count_preemptions, preempting
):
    images = [noise_image(80 + i, size) for i, size in enumerate(SIZES[:3])]
    blocks = 20 if preempting else None
    outputs = chunked_runs(tiny_llava_next_dir, PROMPT, images, 8, blocks, count_preemptions, 12)
    for output, image in zip(outputs, images):
        assert_matches_hf(hf_next, output, PROMPT, [image], max_tokens=12)


def test_grids_that_do_not_fit_the_tower_are_refused(tiny_llava_next_dir, tmp_path):
    import json
    import shutil

    for index, (name, pinpoints, says) in enumerate(
        [
            ("config.json", [[32, 48]], "not all whole grids of the tower's 32-pixel tiles"),
            ("preprocessor_config.json", [[64, 64]], "image_grid_pinpoints differ"),
        ]
    ):
        copy = shutil.copytree(tiny_llava_next_dir, tmp_path / str(index))
        config = json.loads((copy / name).read_text())
        config["image_grid_pinpoints"] = pinpoints
        (copy / name).write_text(json.dumps(config))
        with pytest.raises(ValueError, match=says):
            load_hf_dir(copy, torch.float32)
