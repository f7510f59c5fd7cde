"""LLaVA: prompts with images, checked against transformers' LlavaForConditionalGeneration on a
tiny random checkpoint, through chunked prefill, preemption and the prefix cache."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.llm import LLM
from tests.core.vision_reference import (
    assert_greedy_as_transformers,
    assert_misplaced_images_refused,
    chunked_runs,
    data_url,
    noise_image,
    prefix_cache_runs,
)

PROMPT = "USER: <image>\nWhat is in the picture?\nASSISTANT:"
TWO_IMAGES = "USER: <image>\nand <image>\nWhich differ?\nASSISTANT:"
GREEDY = SamplingParams(temperature=0, max_tokens=8, logprobs=0)


@pytest.fixture(scope="module")
def hf_llava(tiny_llava_dir):
    """transformers' model and image processor for the tiny checkpoint."""
    from transformers import CLIPImageProcessorPil, LlavaForConditionalGeneration

    model = LlavaForConditionalGeneration.from_pretrained(tiny_llava_dir, dtype=torch.float32)
    return model.eval(), CLIPImageProcessorPil.from_pretrained(tiny_llava_dir)


@pytest.fixture(scope="module")
def llava(tiny_llava_dir):
    return LLM(model=str(tiny_llava_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB")


def assert_matches_hf(hf_llava, output, images, max_tokens: int = 8):
    model, processor = hf_llava
    inputs = {
        "input_ids": torch.tensor([output.prompt_token_ids]),
        "pixel_values": processor(images=images, return_tensors="pt")["pixel_values"],
    }
    assert_greedy_as_transformers(output, model, inputs, max_tokens)


def test_a_prompt_with_an_image_matches_transformers(llava, hf_llava, tiny_llava_dir):
    image = noise_image(1)
    [output] = llava.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)
    image_id = llava.engine.arch.vision.image_token_id
    # The placeholder became one token per patch (4 x 4), where it stood.
    assert output.prompt_token_ids.count(image_id) == 16
    assert_matches_hf(hf_llava, output, [image])


def test_images_steer_the_answer_and_each_prompt_keeps_its_own(llava, hf_llava):
    images = [noise_image(2), noise_image(3, (20, 70)), noise_image(4, (33, 33), "L")]
    prompts = [
        {"prompt": PROMPT, "multi_modal_data": {"image": images[0]}},
        {"prompt": PROMPT, "multi_modal_data": {"image": images[1]}},
        {"prompt": TWO_IMAGES, "multi_modal_data": {"image": [images[2], images[0]]}},
    ]
    outputs = llava.generate(prompts, GREEDY)
    assert outputs[0].outputs[0].token_ids != outputs[1].outputs[0].token_ids
    for output, used in zip(outputs, [[images[0]], [images[1]], [images[2], images[0]]]):
        assert_matches_hf(hf_llava, output, used)


def test_a_siglip_tower_before_qwen2_matches_transformers(make_tiny_llava):
    # llava-interleave-qwen's layout: SigLIP (no class token, every position kept, its last
    # layer), a Qwen2 language model; chunks of 8 tokens split its 16-token images.
    from transformers import LlavaForConditionalGeneration, SiglipImageProcessorPil

    path = make_tiny_llava("siglip")
    llm = LLM(model=str(path), dtype="float32", device="cpu", max_num_batched_tokens=8)
    assert llm.engine.arch.architecture == "qwen2" and llm.engine.arch.vision.tower == "siglip"
    hf = LlavaForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    reference = (hf, SiglipImageProcessorPil.from_pretrained(path))
    images = [noise_image(60), noise_image(61, (70, 20))]
    prompts = [
        {"prompt": PROMPT, "multi_modal_data": {"image": images[0]}},
        {"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[::-1]}},
    ]
    first, second = llm.generate(prompts, GREEDY)
    assert first.prompt_token_ids.count(llm.engine.arch.vision.image_token_id) == 16
    assert_matches_hf(reference, first, images[:1])
    assert_matches_hf(reference, second, images[::-1])


def test_chat_with_an_image_url_renders_the_placeholder_and_matches_generate(llava):
    image = noise_image(5)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(image)}},
                {"type": "text", "text": "What is in the picture?"},
            ],
        }
    ]
    [chat] = llava.chat(messages, GREEDY)
    [plain] = llava.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)
    assert chat.prompt == PROMPT
    assert chat.outputs[0].token_ids == plain.outputs[0].token_ids


@pytest.mark.parametrize("preempting", [False, True], ids=["chunked", "chunked+preempted"])
def test_images_split_across_chunks_and_preemptions_match_transformers(
    tiny_llava_dir, hf_llava, count_preemptions, preempting
):
    # Chunks of 8 tokens cut every 16-token image in two; with 8 blocks of 8 for three requests
    # of 30+ tokens, requests are preempted and recomputed (their images encoded again).
    images = [noise_image(10 + i) for i in range(3)]
    blocks = 8 if preempting else None
    outputs = chunked_runs(tiny_llava_dir, PROMPT, images, 8, blocks, count_preemptions, 16)
    for output, image in zip(outputs, images):
        assert_matches_hf(hf_llava, output, [image], max_tokens=16)


def test_the_prefix_cache_tells_images_apart(tiny_llava_dir, hf_llava, llava):
    first, second = noise_image(20), noise_image(21)
    image_token = llava.engine.arch.vision.image_token_id
    _, b, _ = prefix_cache_runs(tiny_llava_dir, PROMPT, image_token, [first, second, first])
    assert_matches_hf(hf_llava, b, [second])


def test_bad_image_prompts_are_refused_naming_the_field(llava, tiny_llama_dir):
    image = noise_image(30)
    with pytest.raises(InvalidRequestError, match="2 images") as error:
        llava.generate({"prompt": PROMPT, "multi_modal_data": {"image": [image, image]}})
    assert error.value.param == "multi_modal_data"
    with pytest.raises(InvalidRequestError, match="no images") as error:
        llava.generate(PROMPT)
    assert error.value.param == "multi_modal_data"
    cut = SamplingParams(max_tokens=4, truncate_prompt_tokens=12)
    with pytest.raises(InvalidRequestError) as error:
        llava.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, cut)
    assert error.value.param == "truncate_prompt_tokens"
    text_model = LLM(
        model=str(tiny_llama_dir), dtype="float32", device="cpu", kv_cache_memory="64MiB"
    )
    with pytest.raises(InvalidRequestError, match="reads no images") as error:
        text_model.generate({"prompt": "Hi <image>", "multi_modal_data": {"image": image}})
    assert error.value.param == "multi_modal_data"
    assert not llava.engine.has_unfinished_requests


class StepImages:
    """A plugin that adds up the images each step's stats say the tower encoded."""

    def __init__(self):
        self.num_images = 0
        self.num_cached = 0
        self.seconds = 0.0

    @hookimpl
    def spyglass_step_finished(self, stats):
        """Count the step's encoded and cached images and the tower's time."""
        self.num_images += stats.num_images_encoded
        self.num_cached += stats.num_images_cached
        self.seconds += stats.vision_time


def test_step_stats_count_each_image_once_per_computation(tiny_llava_dir):
    llm = LLM(model=str(tiny_llava_dir), dtype="float32", device="cpu", max_num_batched_tokens=8)
    counted = StepImages()
    llm.engine.plugin_manager.register(counted)
    images = [noise_image(40), noise_image(41), noise_image(42)]
    prompts = [
        {"prompt": TWO_IMAGES, "multi_modal_data": {"image": images[:2]}},
        {"prompt": PROMPT, "multi_modal_data": {"image": images[2]}},
    ]
    llm.generate(prompts, SamplingParams(max_tokens=2))
    # Chunks of 8 tokens split each 16-token image: each is still encoded once.
    assert counted.num_images == 3
    assert counted.seconds > 0


@pytest.mark.parametrize("cache_tokens", [16384, 0], ids=["cached", "uncached"])
def test_an_image_seen_again_is_taken_from_the_cache(tiny_llava_dir, cache_tokens):
    # Chunks of 8 tokens: the three requests reach the same image in different steps.
    llm = LLM(
        model=str(tiny_llava_dir),
        dtype="float32",
        device="cpu",
        max_num_batched_tokens=8,
        image_cache_tokens=cache_tokens,
    )
    counted = StepImages()
    llm.engine.plugin_manager.register(counted)
    image = noise_image(43)
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}}] * 3
    outputs = llm.generate(prompts, GREEDY)
    assert len({tuple(output.outputs[0].token_ids) for output in outputs}) == 1
    if cache_tokens:
        assert (counted.num_images, counted.num_cached) == (1, 2)
        assert llm.engine.runner.image_cache.num_tokens == 16
    else:
        assert (counted.num_images, counted.num_cached) == (3, 0)
    [alone] = LLM(model=str(tiny_llava_dir), dtype="float32", device="cpu").generate(
        prompts[0], GREEDY
    )
    assert outputs[0].outputs[0].token_ids == alone.outputs[0].token_ids


def test_spans_and_snapshots_count_images_without_their_bytes(llava):
    from spyglass.plugins.tracing.attributes import request_attributes

    image = noise_image(50)
    prompt = {"prompt": TWO_IMAGES, "multi_modal_data": {"image": [image, image]}}
    _, token_ids, images = llava._prompt(prompt)
    llava.engine.add_request("traced", token_ids, SamplingParams(max_tokens=1), images=images)
    request = llava.engine.requests["traced"]
    attributes = request_attributes(request, "tiny")
    assert attributes["spyglass.request.images"] == 2
    [snapshot] = llava.engine.snapshot(with_requests=True).requests  # /debug/requests' view
    assert snapshot.num_images == 2
    assert not any(isinstance(v, bytes) for v in attributes.values())
    llava.engine.abort("traced")
    plain = request_attributes(llava.engine.add_request("plain", [1, 2, 3], SamplingParams()), "t")
    assert "spyglass.request.images" not in plain
    llava.engine.abort("plain")


def test_images_placed_by_hand_must_fill_their_placeholders(llava):
    image = noise_image(70)
    _, token_ids, [placed] = llava._prompt({"prompt": PROMPT, "multi_modal_data": {"image": image}})
    wrong = [
        dataclasses.replace(placed, offset=placed.offset + 1),  # runs past the placeholders
        dataclasses.replace(placed, length=4),
        dataclasses.replace(placed, pixel_values=placed.pixel_values[..., :8]),
    ]
    assert_misplaced_images_refused(llava.engine, token_ids, wrong)
    [output] = llava.generate({"prompt": PROMPT, "multi_modal_data": {"image": image}}, GREEDY)
    assert output.outputs[0].finish_reason in ("length", "stop")  # the engine still serves


def test_limit_mm_per_prompt_caps_the_images_of_a_prompt(tiny_llava_dir):
    with pytest.raises(ValueError, match="limit_mm_per_prompt"):
        LLM(model=str(tiny_llava_dir), device="cpu", limit_mm_per_prompt={"audio": 1})
    llm = LLM(
        model=str(tiny_llava_dir),
        dtype="float32",
        device="cpu",
        kv_cache_memory="32MiB",
        limit_mm_per_prompt={"image": 1},
    )
    images = [noise_image(80), noise_image(81)]
    with pytest.raises(InvalidRequestError, match="at most 1 images") as error:
        llm.generate({"prompt": TWO_IMAGES, "multi_modal_data": {"image": images}})
    assert error.value.param == "multi_modal_data"
    [output] = llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": images[0]}}, GREEDY)
    assert len(output.outputs[0].token_ids) > 0


def test_spyglass_generate_with_an_image_answers_as_chat(llava, tiny_llava_dir, tmp_path):
    image = noise_image(90)
    image.save(tmp_path / "picture.png")
    command = [sys.executable, "-m", "spyglass.core.cli.main", "generate", "What is in the picture?",
               "--model", str(tiny_llava_dir), "--image", str(tmp_path / "picture.png"),
               "--max-tokens", "8", "--dtype", "float32", "--device", "cpu", "--num-threads", "1"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_pil", "image_pil": image},
                {"type": "text", "text": "What is in the picture?"},
            ],
        }
    ]
    [chat] = llava.chat(messages, SamplingParams(temperature=0, max_tokens=8))
    assert result.stdout == chat.outputs[0].text + "\n"
    (tmp_path / "broken.png").write_bytes(b"not a picture")
    command[command.index(str(tmp_path / "picture.png"))] = str(tmp_path / "broken.png")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "--image is not a readable image" in result.stderr
