"""Qwen2-VL and Qwen2.5-VL: images resized to a grid of patches (at about their own size), a
tower with 2D rope (Qwen2.5-VL's within windows), merged patches, and a language model rotating
by M-RoPE's three positions a token; checked against transformers' image processor and models on
tiny random checkpoints, through chunked prefill, preemption and the prefix cache."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.mrope_positions import prompt_positions
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.loaders.hf_loader import load_hf_dir
from tests.core.vision_reference import (
    assert_blocks_returned,
    assert_greedy_as_transformers,
    noise_image,
)

ARCHITECTURES = ["Qwen2VL", "Qwen2_5_VL"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
PROMPT = f"<|im_start|>user\n{IMAGE}What is this?<|im_end|>\n<|im_start|>assistant\n"
TWO_IMAGES = f"<|im_start|>user\n{IMAGE}and{IMAGE}Compare.<|im_end|>\n<|im_start|>assistant\n"
# (width, height): below the least pixels, above the most, wide, tall, square, odd, a sliver.
SIZES = [(10, 12), (200, 150), (50, 20), (24, 60), (33, 33), (41, 27), (6, 90)]


class HFQwen:
    """transformers' model, image processor and tokenizer for a tiny checkpoint, and the inputs
    its processor would make (Qwen2VLProcessor itself wants torchvision's video processor)."""

    def __init__(self, path):
        import transformers

        architecture = json.loads((path / "config.json").read_text())["architectures"][0]
        model_class = getattr(transformers, architecture)
        self.model = model_class.from_pretrained(path, dtype=torch.float32).eval()
        self.images = transformers.Qwen2VLImageProcessorPil.from_pretrained(path)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.pad = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def inputs(self, prompt: str, images: list) -> dict:
        """The prompt's ids, each image's pad expanded to its merged patches, and the pixels."""
        pixels = self.images(images=images, return_tensors="pt")
        counts = iter((pixels["image_grid_thw"].prod(-1) // 4).tolist())
        ids = []
        for token in self.tokenizer(prompt)["input_ids"]:
            ids += [token] * (next(counts) if token == self.pad else 1)
        input_ids = torch.tensor([ids])
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == self.pad).int(),
            **pixels,
        }


@pytest.fixture(scope="module", params=ARCHITECTURES)
def qwen(request, make_tiny_qwen2_vl):
    """(checkpoint directory, transformers' side, our LLM) per architecture."""
    path = make_tiny_qwen2_vl(request.param)
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return path, HFQwen(path), llm


def test_patches_match_the_transformers_processor(qwen):
    path, hf, llm = qwen
    vision = llm.engine.arch.vision
    for seed, size in enumerate(SIZES):
        for mode in ("RGB", "RGBA", "L"):
            image = noise_image(seed, size, mode)
            expected = hf.images(images=image, return_tensors="pt")
            ours = pixel_values(image, vision)
            torch.testing.assert_close(ours.values, expected["pixel_values"], atol=1e-5, rtol=0)


def test_prompt_positions_are_transformers_rope_index(qwen):
    _, hf, llm = qwen
    images = [noise_image(1, (50, 20)), noise_image(2, (24, 60))]
    inputs = hf.inputs(TWO_IMAGES, images)
    vision = llm.engine.arch.vision
    ids, placed = images_in_prompt(hf.tokenizer(TWO_IMAGES)["input_ids"], images, vision, 4096, "")
    assert ids == inputs["input_ids"][0].tolist()
    expected, delta = hf.model.model.get_rope_index(
        inputs["input_ids"], inputs["mm_token_type_ids"], inputs["image_grid_thw"]
    )
    ours = prompt_positions(len(ids), placed, vision)
    np.testing.assert_array_equal(ours.positions, expected[:, 0].numpy())
    assert ours.delta == delta.item()


def test_the_tower_gives_transformers_image_features(qwen):
    _, hf, llm = qwen
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES[:4])]
    expected = hf.images(images=images, return_tensors="pt")
    with torch.no_grad():
        features = hf.model.model.get_image_features(
            expected["pixel_values"], expected["image_grid_thw"]
        ).pooler_output
    vision = llm.engine.arch.vision
    ours = llm.engine.runner.model.encode_images(
        [pixel_values(image, vision).values for image in images], [im.size for im in images]
    )
    for mine, theirs in zip(ours, features, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_images_of_every_shape_match_transformers(qwen):
    _, hf, llm = qwen
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES, start=10)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images]
    prompts.append({"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[2:4]}})
    prompts.append("<|im_start|>user\nNo image here.<|im_end|>\n<|im_start|>assistant\n")
    outputs = llm.generate(prompts, GREEDY)
    used = [[image] for image in images] + [images[2:4], []]
    for output, prompt, pictures in zip(outputs, prompts, used, strict=True):
        text = prompt if isinstance(prompt, str) else prompt["prompt"]
        inputs = hf.inputs(text, pictures) if pictures else hf.tokenizer(text, return_tensors="pt")
        assert_greedy_as_transformers(output, hf.model, dict(inputs), 8)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) > 1
