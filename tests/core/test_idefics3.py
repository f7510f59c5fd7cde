"""Idefics3 and SmolVLM: images cut into tiles, each behind its row and column token, checked
against transformers' processors and models on tiny random checkpoints, through chunked prefill,
preemption and the prefix cache."""

import dataclasses

import pytest
import torch

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.image_tiling import tile_grid
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.loaders.hf_loader import load_hf_dir
from spyglass.core.models.idefics3_vision import Idefics3VisionEncoder
from tests.core.vision_reference import (
    assert_greedy_as_transformers,
    assert_misplaced_images_refused,
    chunked_runs,
    data_url,
    noise_image,
    prefix_cache_runs,
)

PROMPT = "<|im_start|>User:<image>What is in the picture?<end_of_utterance>\nAssistant:"
TWO_IMAGES = "<|im_start|>User:<image>and<image>Which differ?<end_of_utterance>\nAssistant:"
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)
# (width, height): landscape, portrait, square, small (upscaled), a sliver, odd sizes.
SIZES = [(50, 40), (30, 70), (33, 33), (20, 10), (3, 90), (61, 7)]


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


def assert_matches_hf(hf, output, prompt: str, images: list, max_tokens: int = 8):
    model, processor = hf
    assert_greedy_as_transformers(output, model, hf_inputs(processor, prompt, images), max_tokens)


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
        grid = tile_grid(*image.size, vision.tiles)
        assert grid == (expected["rows"][0][0], expected["cols"][0][0])
        assert (ours.width, ours.height) == size
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tower_matches_transformers_image_features(tiny_idefics3_dir, hf_idefics3, dtype):
    model, _ = hf_idefics3
    checkpoint = load_hf_dir(tiny_idefics3_dir, torch.float32)
    vision = checkpoint.arch.vision
    encoder = Idefics3VisionEncoder(vision, checkpoint.weights, "cpu", dtype)
    tiles = pixel_values(noise_image(3, (70, 30)), vision).values
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values=tiles[None]).pooler_output[0]
    ours = encoder(tiles)
    assert ours.shape == (len(tiles), vision.tokens_per_tile, model.config.text_config.hidden_size)
    assert ours.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(ours.flatten(0, 1).float(), expected, atol=tolerance, rtol=tolerance)


def test_smolvlm_without_splitting_matches_transformers(make_tiny_idefics3):
    # Prompts expanded by Idefics3Processor, which writes SmolVLMProcessor's image layout.
    from transformers import (
        AutoTokenizer,
        Idefics3Processor,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessorPil,
    )

    path = make_tiny_idefics3("SmolVLM", split=False)
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="32MiB")
    model = SmolVLMForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    processor = Idefics3Processor(
        SmolVLMImageProcessorPil.from_pretrained(path),
        AutoTokenizer.from_pretrained(path),
        image_seq_len=4,
    )
    hf = model, processor
    images = [noise_image(70), noise_image(71, (20, 90))]
    outputs = llm.generate(
        [
            {"prompt": PROMPT, "multi_modal_data": {"image": images[0]}},
            {"prompt": TWO_IMAGES, "multi_modal_data": {"image": images}},
        ],
        GREEDY,
    )
    # Unsplit, an image is its global image alone: 4 tokens between its three markers.
    assert outputs[0].prompt_token_ids.count(llm.engine.arch.vision.image_token_id) == 4
    assert_matches_hf(hf, outputs[0], PROMPT, images[:1])
    assert_matches_hf(hf, outputs[1], TWO_IMAGES, images)


def test_chat_renders_the_template_and_matches_generate(idefics3, hf_idefics3):
    image = noise_image(5)
    content = [{"type": "text", "text": "What is in the picture?"}]
    messages = [{"role": "user", "content": [{"type": "image"}, *content]}]
    expected = hf_idefics3[1].apply_chat_template(messages, add_generation_prompt=True)
    assert expected == PROMPT
    url = {"type": "image_url", "image_url": {"url": data_url(image)}}
    [chat] = idefics3.chat([{"role": "user", "content": [url, *content]}], GREEDY)
    assert chat.prompt == PROMPT
    assert_matches_hf(hf_idefics3, chat, PROMPT, [image])


@pytest.mark.parametrize("preempting", [False, True], ids=["chunked", "chunked+preempted"])
def test_tiles_split_across_chunks_and_preemptions_match_transformers(
    tiny_idefics3_dir, hf_idefics3, count_preemptions, preempting
):
    # Chunks of 7 tokens cut through tiles and the markers between them; with 12 blocks of 8 for
    # three requests of 60+ tokens, requests are preempted and recomputed.
    images = [noise_image(80 + i, size) for i, size in enumerate(SIZES[:3])]
    blocks = 12 if preempting else None
    outputs = chunked_runs(tiny_idefics3_dir, PROMPT, images, 7, blocks, count_preemptions, 12)
    for output, image in zip(outputs, images):
        assert_matches_hf(hf_idefics3, output, PROMPT, [image], max_tokens=12)


def test_the_prefix_cache_tells_images_apart(tiny_idefics3_dir):
    fake = load_hf_dir(tiny_idefics3_dir, torch.float32).arch.vision.tiles.fake_token_id
    first = noise_image(20)
    prefix_cache_runs(tiny_idefics3_dir, PROMPT, fake, [first, noise_image(21), first])


def test_prompts_expanded_by_transformers_are_taken_as_they_are(idefics3, hf_idefics3):
    images = [noise_image(90), noise_image(91, (30, 70))]
    expanded = hf_inputs(hf_idefics3[1], TWO_IMAGES, images)["input_ids"][0].tolist()
    [output] = idefics3.generate(
        {"prompt_token_ids": expanded, "multi_modal_data": {"image": images}}, GREEDY
    )
    assert output.prompt_token_ids == expanded
    assert_matches_hf(hf_idefics3, output, TWO_IMAGES, images)
    # The same ids with the images swapped (another grid) match neither layout: refused.
    with pytest.raises(InvalidRequestError, match="placeholders") as error:
        idefics3.generate(
            {"prompt_token_ids": expanded, "multi_modal_data": {"image": images[::-1]}}
        )
    assert error.value.param == "multi_modal_data"


def test_tiles_placed_by_hand_must_fill_their_runs(idefics3):
    image = noise_image(92)
    _, token_ids, [placed] = idefics3._prompt(
        {"prompt": PROMPT, "multi_modal_data": {"image": image}}
    )
    wrong = [
        dataclasses.replace(placed, runs=((0, 4), *placed.runs[1:])),  # on the markers
        dataclasses.replace(placed, pixel_values=placed.pixel_values[:-1]),  # a tile short
        dataclasses.replace(placed, length=placed.length - 2),
        dataclasses.replace(placed, size=(20, 10)),  # a one-tile image's layout
        dataclasses.replace(placed, offset=placed.offset + 1),
    ]
    assert_misplaced_images_refused(idefics3.engine, token_ids, wrong)


def test_images_whose_tiles_overflow_the_context_are_refused(tiny_idefics3_dir):
    llm = LLM(model=str(tiny_idefics3_dir), dtype="float32", device="cpu", max_model_len=100)
    big = [noise_image(1), noise_image(2)]  # 3 x 3 tiles each: 64 tokens an image
    with pytest.raises(InvalidRequestError, match="2 images take 128 tokens") as error:
        llm.generate({"prompt": TWO_IMAGES, "multi_modal_data": {"image": big}})
    assert error.value.param == "multi_modal_data"
    [output] = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": big[0]}}, GREEDY)
    assert len(output.outputs[0].token_ids) == 8


def test_request_spans_count_the_tokens_tiles_fill(idefics3):
    from spyglass.plugins.tracing.attributes import request_attributes

    prompt = {
        "prompt": TWO_IMAGES,
        "multi_modal_data": {"image": [noise_image(1), noise_image(3, (20, 10))]},
    }
    _, token_ids, images = idefics3._prompt(prompt)
    idefics3.engine.add_request("traced", token_ids, SamplingParams(max_tokens=1), images=images)
    attributes = request_attributes(idefics3.engine.requests["traced"], "tiny")
    # 50 x 40 becomes 72 x 72: 3 x 3 tiles (64 tokens); 20 x 10 becomes 60 x 30, then 72 x 48:
    # 2 x 3 tiles (6 x 6 + 2 newlines + 7 for the global image: 45 tokens).
    assert attributes["spyglass.request.images"] == 2
    assert attributes["spyglass.request.image_tokens"] == 64 + 45
    idefics3.engine.abort("traced")


def _changed_copy(source, tmp_path, name: str, change) -> str:
    """A copy of the checkpoint ``source`` whose JSON file ``name`` ``change`` edits in place."""
    import json
    import shutil

    copy = shutil.copytree(source, tmp_path / "changed")
    config = json.loads((copy / name).read_text())
    change(config)
    (copy / name).write_text(json.dumps(config))
    return str(copy)


def test_checkpoints_that_do_not_run_here_are_refused_naming_why(tiny_idefics3_dir, tmp_path):
    def tiles_of_32(config):
        config["image_processor"]["max_image_size"] = {"longest_edge": 32}

    def qwen2_text(config):
        config["text_config"]["model_type"] = "qwen2"

    def no_global_token(config):
        for token in config["added_tokens"]:
            if token["content"] == "<global-img>":
                token["content"] = "<global-image>"

    cases = [
        ("processor_config.json", tiles_of_32, "32-pixel tiles; the vision tower takes 24"),
        ("config.json", qwen2_text, "'qwen2' language model"),
        ("tokenizer.json", no_global_token, "no <global-img> token"),
    ]
    for index, (name, change, says) in enumerate(cases):
        path = _changed_copy(tiny_idefics3_dir, tmp_path / str(index), name, change)
        with pytest.raises(ValueError, match=says):
            load_hf_dir(path, torch.float32)


def test_the_engine_option_turns_splitting_off_as_the_processor_would(tiny_idefics3_dir):
    from transformers import AutoProcessor, Idefics3ForConditionalGeneration

    llm = LLM(
        model=str(tiny_idefics3_dir),
        dtype="float32",
        device="cpu",
        kv_cache_memory="32MiB",
        mm_processor_kwargs={"do_image_splitting": False},
    )
    image = noise_image(72)
    [output] = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)
    # Unsplit, the image is its global image alone: 4 tokens (3 x 3 tiles when split).
    assert output.prompt_token_ids.count(llm.engine.arch.vision.image_token_id) == 4
    model = Idefics3ForConditionalGeneration.from_pretrained(tiny_idefics3_dir, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(tiny_idefics3_dir, do_image_splitting=False)
    assert_matches_hf((model.eval(), processor), output, PROMPT, [image])
