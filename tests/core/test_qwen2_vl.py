"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: images resized to a grid of patches (at about their own
size), a tower with 2D rope (Qwen2.5-VL's within windows; Qwen3-VL's with learned position
embeddings and DeepStack features for the first layers), merged patches, and a language model
rotating by M-RoPE's three positions a token (Qwen3-VL's interleaved); checked against
transformers' image processor and models on tiny random checkpoints, through chunked prefill,
preemption and the prefix cache."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.mrope_positions import prompt_positions
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.loaders.hf_loader import load_hf_dir
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

ARCHITECTURES = ["Qwen2VL", "Qwen2_5_VL", "Qwen3VL"]
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
    _, hf, llm = qwen
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
        output = hf.model.model.get_image_features(
            expected["pixel_values"], expected["image_grid_thw"]
        )
    # Qwen3-VL's DeepStack features follow each token's own, side by side.
    deepstack = getattr(output, "deepstack_features", None) or []
    features = [torch.cat(per_image, dim=-1) for per_image in zip(output.pooler_output, *deepstack)]
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


def test_chat_renders_the_template_and_matches_transformers(qwen):
    _, hf, llm = qwen
    image = noise_image(5)
    text = {"type": "text", "text": "What is this?"}
    url = {"type": "image_url", "image_url": {"url": data_url(image)}}
    [chat] = llm.chat([{"role": "user", "content": [url, text]}], GREEDY)
    assert chat.prompt == PROMPT
    assert_greedy_as_transformers(chat, hf.model, hf.inputs(PROMPT, [image]), 8)


@pytest.fixture(scope="module", params=["Qwen2_5_VL", "Qwen3VL"])
def later_qwen(request, make_tiny_qwen2_vl):
    """Qwen2.5-VL's and Qwen3-VL's checkpoint directory and transformers' side."""
    path = make_tiny_qwen2_vl(request.param)
    return path, HFQwen(path)


@pytest.mark.parametrize("preempting", [False, True], ids=["chunked", "chunked+preempted"])
def test_images_split_across_chunks_and_preemptions_match_transformers(
    later_qwen, count_preemptions, preempting
):
    # Chunks of 7 tokens cut through images' rows; with 16 blocks of 8 for three requests of
    # 40 to 60 tokens, requests are preempted and recomputed (M-RoPE positions and all).
    path, hf = later_qwen
    images = [noise_image(80 + i, size) for i, size in enumerate([(200, 150), (50, 20), (24, 60)])]
    blocks = 16 if preempting else None
    outputs = chunked_runs(path, PROMPT, images, 7, blocks, count_preemptions, 12)
    for output, image in zip(outputs, images, strict=True):
        assert_greedy_as_transformers(output, hf.model, hf.inputs(PROMPT, [image]), 12)


def test_the_prefix_cache_tells_images_apart(later_qwen):
    path, hf = later_qwen
    first = noise_image(20)
    _, _, again = prefix_cache_runs(path, PROMPT, hf.pad, [first, noise_image(21), first])
    assert_greedy_as_transformers(again, hf.model, hf.inputs(PROMPT, [first]), 8)


def test_prompts_expanded_by_transformers_are_taken_as_they_are(qwen):
    _, hf, llm = qwen
    images = [noise_image(90), noise_image(91, (24, 60))]
    inputs = hf.inputs(TWO_IMAGES, images)
    expanded = inputs["input_ids"][0].tolist()
    [output] = llm.generate(
        {"prompt_token_ids": expanded, "multi_modal_data": {"image": images}}, GREEDY
    )
    assert_greedy_as_transformers(output, hf.model, inputs, 8)


def test_images_too_narrow_and_images_placed_wrong_are_refused(qwen):
    _, _, llm = qwen
    with pytest.raises(InvalidRequestError, match="differ at most 200 times") as error:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": noise_image(1, (1, 300))}})
    assert error.value.param == "multi_modal_data"
    _, token_ids, [placed] = llm._prompt(
        {"prompt": PROMPT, "multi_modal_data": {"image": noise_image(2)}}
    )
    wrong = [
        dataclasses.replace(placed, pixel_values=placed.pixel_values[:-4]),  # a merged patch short
        dataclasses.replace(placed, size=(24, 60)),  # another grid
        dataclasses.replace(placed, offset=placed.offset - 1),
    ]
    assert_misplaced_images_refused(llm.engine, token_ids, wrong)


def test_checkpoints_as_the_hub_ships_them_load(make_tiny_qwen2_vl, tmp_path):
    """The Hub's Qwen2-VL directories: a flat config.json (the language model's keys at the top,
    ``rope_scaling`` of type ``mrope``) and ``visual.`` / ``model.`` parameter names."""
    saved = make_tiny_qwen2_vl("Qwen2VL")
    renames = (("model.language_model.", "model."), ("model.visual.", "visual."))
    hub = renamed_copy(saved, tmp_path / "hub", renames)
    config = json.loads((hub / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    config.update(text, rope_theta=rope.pop("rope_theta"), rope_scaling={"type": "mrope", **rope})
    del config["rope_scaling"]["rope_type"]
    (hub / "config.json").write_text(json.dumps(config))
    assert_loads_alike(hub, saved)
    rope = load_hf_dir(hub, torch.float32).arch.rope_scaling
    assert rope == {"rope_type": "mrope", "mrope_section": [2, 3, 3]}


def test_checkpoints_that_do_not_run_here_are_refused_naming_why(make_tiny_qwen2_vl, tmp_path):
    saved = make_tiny_qwen2_vl("Qwen2VL")
    for index, (name, change, says) in enumerate(
        [
            ("preprocessor_config.json", {"patch_size": 8}, "the vision tower takes 4"),
            ("preprocessor_config.json", {"do_normalize": False}, "turns off"),
            ("config.json", {"vision_config": {"hidden_size": 32}}, "is 64 wide"),
        ]
    ):
        copy = shutil.copytree(saved, tmp_path / str(index))
        config = json.loads((copy / name).read_text())
        for key, value in change.items():
            config[key] = {**config[key], **value} if isinstance(value, dict) else value
        (copy / name).write_text(json.dumps(config))
        with pytest.raises(ValueError, match=says):
            load_hf_dir(copy, torch.float32)


def test_the_engine_pixel_bounds_resize_as_the_processor_would(make_tiny_qwen2_vl):
    import transformers

    path = make_tiny_qwen2_vl("Qwen2VL")
    bounds = {"min_pixels": 64, "max_pixels": 1024}
    llm = LLM(
        model=str(path),
        dtype="float32",
        device="cpu",
        kv_cache_memory="32MiB",
        mm_processor_kwargs=bounds,
    )
    hf = HFQwen(path)
    hf.images = transformers.Qwen2VLImageProcessorPil.from_pretrained(path, **bounds)
    images = [noise_image(3, (200, 150)), noise_image(4, (6, 10))]
    outputs = llm.generate(
        [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images], GREEDY
    )
    # 200 x 150 within 1,024 pixels: 32 x 24 (4 x 3 tokens, not the default bound's 6 x 4);
    # 6 x 10 over 64 pixels: 8 x 8 (one token; the default least would make it 16 x 16).
    assert [o.prompt_token_ids.count(hf.pad) for o in outputs] == [12, 1]
    for output, image in zip(outputs, images, strict=True):
        assert_greedy_as_transformers(output, hf.model, hf.inputs(PROMPT, [image]), 8)


@pytest.mark.parametrize(
    ("fixture", "options", "says"),
    [
        ("tiny_qwen2_5_vl_dir", {"fps": 2}, r"\['fps'\] are not options"),
        ("tiny_qwen2_5_vl_dir", {"max_pixels": 32}, "max_pixels >= 64"),
        ("tiny_qwen2_5_vl_dir", {"min_pixels": 500, "max_pixels": 400}, "min_pixels <= max"),
        ("tiny_qwen2_5_vl_dir", {"max_pixels": "1024"}, "whole numbers"),
        ("tiny_idefics3_dir", {"do_image_splitting": "no"}, "true or false"),
        ("tiny_llava_dir", {"do_image_splitting": False}, "takes none"),
        ("tiny_llama_dir", {"max_pixels": 1024}, "reads no images"),
    ],
)
def test_engine_processor_options_a_model_does_not_take_are_refused(
    request, fixture, options, says
):
    path = request.getfixturevalue(fixture)
    with pytest.raises(ValueError, match=says):
        LLM(model=str(path), dtype="float32", device="cpu", mm_processor_kwargs=options)


def test_a_prompts_own_processor_options_are_refused(qwen):
    _, _, llm = qwen
    prompt = {
        "prompt": PROMPT,
        "multi_modal_data": {"image": noise_image(1)},
        "mm_processor_kwargs": {"max_pixels": 1024},
    }
    with pytest.raises(InvalidRequestError, match="give the engine's") as error:
        llm.generate(prompt)
    assert error.value.param == "mm_processor_kwargs"


def test_audio_is_refused_not_read_as_text(qwen):
    _, _, llm = qwen
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    with pytest.raises(InvalidRequestError, match="'input_audio' content parts") as error:
        llm.chat([{"role": "user", "content": [audio, {"type": "text", "text": "Hi"}]}])
    assert error.value.param == "messages"
    with pytest.raises(InvalidRequestError, match=r"\['audio'\]: images and videos") as error:
        llm.generate({"prompt": PROMPT, "multi_modal_data": {"audio": b"RIFF"}})
    assert error.value.param == "multi_modal_data"
    assert not llm.engine.has_unfinished_requests
