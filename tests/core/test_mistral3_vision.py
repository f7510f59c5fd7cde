"""Mistral 3's vision (Pixtral's tower): images read at about their own size, each row of merged
patches a row of [IMG] tokens ended by [IMG_BREAK] (the last by [IMG_END]), 2D rope within each
image; checked against transformers' image processor, processor and model on a tiny random
checkpoint, through chunked prefill, preemption and the prefix cache."""

import dataclasses

import pytest
import torch

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from tests.core.vision_reference import (
    assert_greedy_as_transformers,
    assert_loads_alike,
    assert_misplaced_images_refused,
    chunked_runs,
    data_url,
    noise_image,
    prefix_cache_runs,
    renamed_copy,
)

GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
# The tiny tokenizer's BOS (the default model's) stands for Mistral's <s>.
PROMPT = "<|im_start|>[INST][IMG]What is this?[/INST]"
TWO_IMAGES = "<|im_start|>[INST][IMG]and[IMG]Compare.[/INST]"
# (width, height): small, wide, tall (scaled down), square at the limit, odd, a sliver.
SIZES = [(20, 12), (200, 50), (24, 90), (64, 64), (33, 41), (3, 70)]


class HFMistral3:
    """transformers' model, image processor and tokenizer for the tiny checkpoint, and the
    inputs its processor would make (PixtralProcessor itself wants torchvision)."""

    def __init__(self, path):
        import transformers

        self.model = transformers.Mistral3ForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32
        ).eval()
        self.images = transformers.PixtralImageProcessorPil.from_pretrained(path)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        ids = self.tokenizer.convert_tokens_to_ids
        self.image_token, self.row_break, self.end = ids(["[IMG]", "[IMG_BREAK]", "[IMG_END]"])

    def inputs(self, prompt: str, images: list) -> dict:
        """The prompt's ids, each [IMG] expanded as PixtralProcessor expands it (a row of [IMG]
        per row of 8-pixel merged patches of the processed image, each row ended by
        [IMG_BREAK], the last by [IMG_END]), and the pixels."""
        token_ids = self.tokenizer(prompt)["input_ids"]
        if not images:
            return {"input_ids": torch.tensor([token_ids])}
        pixels = self.images(images=images, return_tensors="pt")
        sizes = iter(pixels["image_sizes"].tolist())
        expanded = []
        for token in token_ids:
            if token != self.image_token:
                expanded.append(token)
                continue
            height, width = next(sizes)
            rows = [[self.image_token] * (width // 8) + [self.row_break]] * (height // 8)
            rows[-1] = [*rows[-1][:-1], self.end]
            expanded += [t for row in rows for t in row]
        input_ids = torch.tensor([expanded])
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), **pixels}


@pytest.fixture(scope="module")
def mistral3(tiny_mistral3_dir):
    """(checkpoint directory, transformers' side, our LLM)."""
    path = tiny_mistral3_dir
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return path, HFMistral3(path), llm


def test_pixels_match_the_transformers_processor(mistral3):
    _, hf, llm = mistral3
    vision = llm.engine.arch.vision
    for seed, size in enumerate(SIZES):
        for mode in ("RGB", "RGBA", "L"):
            image = noise_image(seed, size, mode)
            expected = hf.images(images=image, return_tensors="pt")["pixel_values"]
            ours = pixel_values(image, vision).values
            torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_the_tower_gives_transformers_image_features(mistral3):
    _, hf, llm = mistral3
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES)]
    expected = hf.images(images=images, return_tensors="pt")
    with torch.no_grad():
        features = hf.model.model.get_image_features(
            expected["pixel_values"], expected["image_sizes"], vision_feature_layer=-1
        ).pooler_output
    vision = llm.engine.arch.vision
    ours = llm.engine.runner.model.encode_images(
        [pixel_values(image, vision).values for image in images], [im.size for im in images]
    )
    for mine, theirs in zip(ours, features, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_prompts_are_expanded_as_the_processor_does(mistral3):
    _, hf, llm = mistral3
    images = [noise_image(3, (200, 50)), noise_image(4, (24, 90))]
    _, token_ids, placed = llm._prompt(
        {"prompt": TWO_IMAGES, "multi_modal_data": {"image": images}}
    )
    assert token_ids == hf.inputs(TWO_IMAGES, images)["input_ids"][0].tolist()
    # 200 x 50 pixels: scaled to 64 x 16, 8 x 2 merged patches; 24 x 90: scaled to 17 x 64,
    # rounded up to 24 x 64, 3 x 8.
    assert [image.runs for image in placed] == [
        tuple((9 * row, 8) for row in range(2)),
        tuple((4 * row, 3) for row in range(8)),
    ]


def test_images_match_transformers(mistral3):
    _, hf, llm = mistral3
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES, start=10)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images]
    prompts.append({"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[1:3]}})
    prompts.append("<|im_start|>[INST]No image here.[/INST]")
    outputs = llm.generate(prompts, GREEDY)
    used = [[image] for image in images] + [images[1:3], []]
    for output, prompt, pictures in zip(outputs, prompts, used, strict=True):
        text = prompt if isinstance(prompt, str) else prompt["prompt"]
        assert_greedy_as_transformers(output, hf.model, hf.inputs(text, pictures), 8)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) > 1


def test_chat_renders_the_template_and_matches_transformers(mistral3):
    _, hf, llm = mistral3
    image = noise_image(5)
    text = {"type": "text", "text": "What is this?"}
    url = {"type": "image_url", "image_url": {"url": data_url(image)}}
    [chat] = llm.chat([{"role": "user", "content": [url, text]}], GREEDY)
    assert chat.prompt == PROMPT
    assert_greedy_as_transformers(chat, hf.model, hf.inputs(PROMPT, [image]), 8)


@pytest.mark.parametrize("preempting", [False, True], ids=["chunked", "chunked+preempted"])
def test_images_split_across_chunks_and_preemptions_match_transformers(
    mistral3, count_preemptions, preempting
):
    # Chunks of 7 tokens cut through images' rows; with 12 blocks of 8 for three requests of
    # 25 to 45 tokens, requests are preempted and recomputed.
    path, hf, _ = mistral3
    images = [noise_image(80 + i, size) for i, size in enumerate(SIZES[:3])]
    blocks = 12 if preempting else None
    outputs = chunked_runs(path, PROMPT, images, 7, blocks, count_preemptions, 12)
    for output, image in zip(outputs, images, strict=True):
        assert_greedy_as_transformers(output, hf.model, hf.inputs(PROMPT, [image]), 12)


def test_the_prefix_cache_tells_images_apart(mistral3):
    path, hf, _ = mistral3
    first = noise_image(20)
    _, _, again = prefix_cache_runs(path, PROMPT, hf.image_token, [first, noise_image(21), first])
    assert_greedy_as_transformers(again, hf.model, hf.inputs(PROMPT, [first]), 8)


def test_prompts_expanded_by_transformers_are_taken_as_they_are(mistral3):
    _, hf, llm = mistral3
    images = [noise_image(90), noise_image(91, (24, 90))]
    inputs = hf.inputs(TWO_IMAGES, images)
    expanded = inputs["input_ids"][0].tolist()
    [output] = llm.generate(
        {"prompt_token_ids": expanded, "multi_modal_data": {"image": images}}, GREEDY
    )
    assert_greedy_as_transformers(output, hf.model, inputs, 8)


def test_images_placed_wrong_are_refused(mistral3):
    _, _, llm = mistral3
    _, token_ids, [placed] = llm._prompt(
        {"prompt": PROMPT, "multi_modal_data": {"image": noise_image(2)}}
    )
    wrong = [
        dataclasses.replace(placed, pixel_values=placed.pixel_values[:, :, :-8]),  # a row short
        dataclasses.replace(placed, size=(24, 90)),  # another grid
        dataclasses.replace(placed, offset=placed.offset - 1),
    ]
    assert_misplaced_images_refused(llm.engine, token_ids, wrong)


def test_checkpoints_named_as_in_memory_load_the_same_weights(tiny_mistral3_dir, tmp_path):
    # transformers saves the Hub's names (language_model.model., vision_tower.,
    # multi_modal_projector.); its in-memory names (model.language_model., ...) load the same.
    renames = [
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ]
    in_memory = renamed_copy(tiny_mistral3_dir, tmp_path / "in_memory", renames)
    assert_loads_alike(in_memory, tiny_mistral3_dir)
