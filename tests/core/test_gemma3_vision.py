"""Gemma 3's vision: SigLIP's tower pooled into 256 (here 16) tokens an image, placed between
newlines and the image start and end tokens, whose tokens attend to every token of their own
image; checked against transformers' processor and model on a tiny random checkpoint, through
chunked prefill (which never ends inside an image), preemption and the prefix cache."""

import dataclasses

import pytest
import torch

from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.image_preprocess import pixel_values
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.sched.image_chunks import chunk_within_images
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
# Text after an image starts with a space: the tiny tokenizer (GPT-2's pre-split) then reads the
# image's closing "\n\n" as one token, as Gemma's tokenizer always does.
# The tiny tokenizer's BOS (the default model's) stands for Gemma's <bos>.
BOS = "<|im_start|>"
TURN = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
PROMPT = BOS + TURN.format("<start_of_image> What is this?")
IMAGES = "<start_of_image> and<start_of_image><start_of_image> Compare."
THREE_IMAGES = BOS + TURN.format(IMAGES)
SIZES = [(50, 40), (32, 32), (7, 90), (300, 20)]


class HFGemma3:
    """transformers' model and processor for the tiny checkpoint."""

    def __init__(self, path):
        import transformers

        self.model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32
        ).eval()
        self.images = transformers.Gemma3ImageProcessorPil.from_pretrained(path)
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            path,
            extra_special_tokens={
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
        )
        self.processor = transformers.Gemma3Processor(
            image_processor=self.images, tokenizer=tokenizer, image_seq_length=16
        )
        self.soft = tokenizer.convert_tokens_to_ids("<image_soft_token>")

    def inputs(self, prompt: str, images: list) -> dict:
        """What Gemma3Processor makes of the prompt (its BOS written out) and images."""
        inputs = self.processor(
            text=[prompt], images=[images] if images else None, return_tensors="pt"
        )
        inputs.pop("token_type_ids")
        ids = inputs["input_ids"]
        return {**inputs, "token_type_ids": (ids == self.soft).long()}


@pytest.fixture(scope="module")
def gemma3(tiny_gemma3_vision_dir):
    """(checkpoint directory, transformers' side, our LLM)."""
    path = tiny_gemma3_vision_dir
    llm = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return path, HFGemma3(path), llm


def test_pixels_match_the_transformers_processor(gemma3):
    _, hf, llm = gemma3
    vision = llm.engine.arch.vision
    for seed, size in enumerate(SIZES):
        for mode in ("RGB", "RGBA", "L"):
            image = noise_image(seed, size, mode)
            expected = hf.images(images=image, return_tensors="pt")["pixel_values"]
            torch.testing.assert_close(
                pixel_values(image, vision).values, expected, atol=1e-5, rtol=0
            )


def test_the_tower_gives_transformers_image_features(gemma3):
    _, hf, llm = gemma3
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES)]
    pixels = hf.images(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        expected = hf.model.model.get_image_features(pixels).pooler_output
    vision = llm.engine.arch.vision
    ours = llm.engine.runner.model.encode_images(
        [pixel_values(image, vision).values for image in images], [im.size for im in images]
    )
    for mine, theirs in zip(ours, expected, strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_prompts_are_expanded_as_the_gemma3_processor_does(gemma3):
    _, hf, llm = gemma3
    images = [noise_image(3), noise_image(4), noise_image(5)]
    _, token_ids, placed = llm._prompt(
        {"prompt": THREE_IMAGES, "multi_modal_data": {"image": images}}
    )
    assert token_ids == hf.inputs(THREE_IMAGES, images)["input_ids"][0].tolist()
    # "\n" before the first image and the "\n\n" between the second and third are joined
    # into "\n\n\n" and "\n\n\n\n" tokens, which each image counts as its own.
    newlines = [hf.processor.tokenizer.convert_tokens_to_ids(t) for t in ("ĊĊĊ", "ĊĊĊĊ")]
    assert [token_ids[image.offset] for image in placed] == [newlines[0], 1116, newlines[1]]
    assert placed[1].end - 1 == placed[2].offset
    assert [image.runs for image in placed] == [((2, 16),)] * 3


def test_images_match_transformers(gemma3):
    _, hf, llm = gemma3
    images = [noise_image(seed, size) for seed, size in enumerate(SIZES, start=10)]
    prompts = [{"prompt": PROMPT, "multi_modal_data": {"image": image}} for image in images]
    prompts.append({"prompt": THREE_IMAGES, "multi_modal_data": {"image": images[:3]}})
    prompts.append(BOS + TURN.format("No image here."))
    outputs = llm.generate(prompts, GREEDY)
    used = [[image] for image in images] + [images[:3], []]
    for output, prompt, pictures in zip(outputs, prompts, used, strict=True):
        text = prompt if isinstance(prompt, str) else prompt["prompt"]
        assert_greedy_as_transformers(output, hf.model, hf.inputs(text, pictures), 8)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) > 1


def test_image_tokens_see_their_whole_image(gemma3, tiny_gemma3_vision_dir):
    # Served as a causal model would be, the same prompt's logprobs are not transformers'.
    _, hf, llm = gemma3
    causal = LLM(model=str(tiny_gemma3_vision_dir), dtype="float32", device="cpu")
    vision = causal.engine.arch.vision
    causal.engine.arch = dataclasses.replace(
        causal.engine.arch, vision=dataclasses.replace(vision, bidirectional=False)
    )
    causal.engine.runner.model.arch = causal.engine.arch
    prompt = {"prompt": PROMPT, "multi_modal_data": {"image": noise_image(30)}}
    [ours] = llm.generate(prompt, GREEDY)
    [theirs] = causal.generate(prompt, GREEDY)
    assert_greedy_as_transformers(ours, hf.model, hf.inputs(PROMPT, [noise_image(30)]), 8)
    difference = [
        abs(a.logprob - b.logprob)
        for a, b in zip(ours.outputs[0].logprobs, theirs.outputs[0].logprobs)
    ]
    assert max(difference) > 1e-3


def test_chat_renders_the_template_and_matches_transformers(gemma3):
    _, hf, llm = gemma3
    image = noise_image(5)
    text = {"type": "text", "text": " What is this?"}
    url = {"type": "image_url", "image_url": {"url": data_url(image)}}
    [chat] = llm.chat([{"role": "user", "content": [url, text]}], GREEDY)
    assert chat.prompt == PROMPT
    assert_greedy_as_transformers(chat, hf.model, hf.inputs(PROMPT, [image]), 8)


@pytest.mark.parametrize("preempting", [False, True], ids=["chunked", "chunked+preempted"])
def test_chunks_keep_images_whole_and_match_transformers(gemma3, count_preemptions, preempting):
    # Chunks of up to 20 tokens would end inside the 16 image tokens (which start at position
    # 5); they end before them instead. With 12 blocks of 8 for three requests of 33 tokens,
    # requests are preempted and recomputed.
    path, hf, _ = gemma3
    images = [noise_image(80 + i, size) for i, size in enumerate(SIZES[:3])]
    blocks = 12 if preempting else None
    outputs = chunked_runs(path, PROMPT, images, 20, blocks, count_preemptions, 12)
    for output, image in zip(outputs, images, strict=True):
        assert_greedy_as_transformers(output, hf.model, hf.inputs(PROMPT, [image]), 12)


def test_a_chunk_ends_before_an_image_it_cannot_finish(gemma3):
    _, _, llm = gemma3
    _, _, [image] = llm._prompt({"prompt": PROMPT, "multi_modal_data": {"image": noise_image(1)}})
    request = dataclasses.make_dataclass("R", ["images"])((image,))
    run_start, run_end, _ = image.embedding_runs()[0]
    assert chunk_within_images(request, 0, run_start + 3) == run_start
    assert chunk_within_images(request, 0, run_end) == run_end
    assert chunk_within_images(request, run_start, 10) == 0
    assert (
        chunk_within_images(request, run_start + 5, run_end - run_start - 5)
        == run_end - run_start - 5
    )
    assert chunk_within_images(request, run_end, 4) == 4


def test_chunks_that_stop_before_an_image_are_counted(tiny_gemma3_vision_dir):
    # A 20-token budget: the first chunk would end inside the image (tokens 5 to 20), so it
    # stops at 5; the next holds the whole image.
    llm = LLM(model=str(tiny_gemma3_vision_dir), device="cpu", max_num_batched_tokens=20)
    waits = []

    class Watcher:
        @hookimpl
        def spyglass_step_finished(self, stats):
            waits.append((stats.num_scheduled_tokens, stats.num_image_waits))

    llm.engine.plugin_manager.register(Watcher())
    llm.generate({"prompt": PROMPT, "multi_modal_data": {"image": noise_image(1)}}, GREEDY)
    assert waits[:2] == [(5, 1), (20, 0)]
    assert sum(count for _, count in waits) == 1


def test_the_prefix_cache_tells_images_apart(gemma3):
    path, hf, _ = gemma3
    first = noise_image(20)
    three_newlines = hf.processor.tokenizer.convert_tokens_to_ids("ĊĊĊ")
    _, _, again = prefix_cache_runs(path, PROMPT, three_newlines, [first, noise_image(21), first])
    assert_greedy_as_transformers(again, hf.model, hf.inputs(PROMPT, [first]), 8)


def test_prompts_expanded_by_transformers_are_taken_as_they_are(gemma3):
    _, hf, llm = gemma3
    images = [noise_image(90), noise_image(91, (24, 60)), noise_image(92)]
    inputs = hf.inputs(THREE_IMAGES, images)
    expanded = inputs["input_ids"][0].tolist()
    [output] = llm.generate(
        {"prompt_token_ids": expanded, "multi_modal_data": {"image": images}}, GREEDY
    )
    assert_greedy_as_transformers(output, hf.model, inputs, 8)


def test_a_step_budget_below_an_image_is_refused(tiny_gemma3_vision_dir):
    with pytest.raises(ValueError, match="max_num_batched_tokens \\(15\\) must be at least 16"):
        LLM(model=str(tiny_gemma3_vision_dir), device="cpu", max_num_batched_tokens=15)


def test_images_placed_wrong_are_refused(gemma3):
    _, _, llm = gemma3
    _, token_ids, [placed] = llm._prompt(
        {"prompt": PROMPT, "multi_modal_data": {"image": noise_image(2)}}
    )
    wrong = [
        dataclasses.replace(placed, offset=placed.offset + 1),
        dataclasses.replace(placed, pixel_values=placed.pixel_values[:, :, :16]),
    ]
    assert_misplaced_images_refused(llm.engine, token_ids, wrong)


def test_checkpoints_named_as_in_memory_load_the_same_weights(tiny_gemma3_vision_dir, tmp_path):
    # transformers saves the Hub's names (language_model.model., vision_tower.vision_model.);
    # its in-memory names (model.language_model., model.vision_tower.) load the same.
    renames = [
        ("language_model.model.", "model.language_model."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ]
    in_memory = renamed_copy(tiny_gemma3_vision_dir, tmp_path / "in_memory", renames)
    assert_loads_alike(in_memory, tiny_gemma3_vision_dir)
