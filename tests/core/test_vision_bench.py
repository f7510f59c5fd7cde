"""``spyglass bench vision`` at toy scale: on the tiny LLaVA and Idefics3 both sides time the same
prompts and give the same greedy tokens; the random LLaVA and SmolVLM it builds load and run."""

import re
from pathlib import Path

import pytest

from spyglass.core.cli.bench import vision
from spyglass.core.cli.bench.random_vlm import (
    TowerShape,
    write_random_gemma3,
    write_random_llava,
    write_random_mistral3,
    write_random_onevision,
    write_random_qwen2_5_vl,
    write_random_qwen3_vl,
    write_random_smolvlm,
)
from spyglass.core.cli.main import build_parser
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM

TINY = ["--device", "cpu", "--kv-cache-memory", "16MiB", "--num-threads", "1"]


def _compared(model_dir: Path, num_prompts: int = 3, *extra: str):
    """The parsed ``bench vision`` options and its comparison on ``model_dir``: a few prompts of
    6 text tokens and an image, 4 tokens out, one run a side, HF in batches of 2; ``extra``
    options."""
    argv = ["bench", "vision", "--model", str(model_dir), *TINY, "--num-prompts", str(num_prompts),
            "--text-tokens", "6", "--max-tokens", "4", "--repeats", "1", "--hf-batch-size", "2",
            *extra]  # fmt: skip
    args = build_parser(argv).parse_args(argv)
    return args, vision.compare(args, model_dir)


def test_bench_vision_times_both_sides_and_they_agree(tiny_llava_dir, capsys):
    # 8-token chunks split each 16-token image between steps.
    argv = ["bench", "vision", "--model", str(tiny_llava_dir), *TINY, "--num-prompts", "5",
            "--text-tokens", "9", "--max-tokens", "6", "--repeats", "2", "--hf-batch-size", "2",
            "--max-num-batched-tokens", "8"]  # fmt: skip
    args = build_parser(argv).parse_args(argv)
    result = vision.compare(args, Path(args.model))
    for side in (result.spyglass, result.hf):
        # 9 text tokens and one 16-token image per prompt.
        assert (side.num_prompt_tokens, side.num_output_tokens) == (5 * 25, 5 * 6)
        assert side.seconds > 0
    assert result.tokens_per_image == 16
    assert result.num_identical == 5
    assert 0 < result.vision_share < 1
    assert result.speedup == pytest.approx(result.hf.seconds / result.spyglass.seconds)

    vision.report(args, result)
    out = capsys.readouterr().out
    assert "5 prompts of 9 text tokens and one image (16 tokens)" in out
    assert f"spyglass / hf throughput: {result.speedup:.2f}x" in out
    assert "agreement: 5 of 5 prompts gave identical greedy tokens" in out


def test_bench_vision_on_tiles_agrees_with_transformers(tiny_idefics3_dir, capsys):
    args, result = _compared(tiny_idefics3_dir)
    # A 60-pixel square image: 3 x 3 tiles and the global one, 4 tokens each, with their markers.
    assert (result.tiles_per_image, result.tokens_per_image) == (10, 64)
    assert result.num_identical == 3
    vision.report(args, result)
    assert "one image (10 tiles, 64 tokens)" in capsys.readouterr().out


@pytest.mark.parametrize("arch", ["llava", "llava-next", "smolvlm"])
def test_the_random_models_load_and_read_images(tmp_path, arch):
    tower = TowerShape(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2)
    if arch == "smolvlm":
        model_dir = write_random_smolvlm(tmp_path / arch, tower, grid=2, text_layers=1, seed=0)
    else:
        model_dir = write_random_llava(tmp_path / arch, tower, 1, 0, arch == "llava-next")
    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", kv_cache_memory="32MiB")
    # LLaVA: 4 x 4 patches a token each. LLaVA-NeXT: a 64-pixel square image is the base tile
    # (16 tokens) and a 2 x 2 grid, 8 x 8 features with a newline a row (72 tokens). SmolVLM:
    # 4 x 4 patches shuffled into one token a tile, each image 2 x 2 tiles and the global one.
    tokens, tiles = {"llava": (16, 1), "llava-next": (16 + 72, 5), "smolvlm": (5, 5)}[arch]
    assert llm.engine.arch.num_hidden_layers == 1
    [(token_ids, images)] = vision.vision_prompts(llm.engine, 1, 6, seed=3)
    assert token_ids.count(llm.engine.arch.vision.image_token_id) == tokens
    assert len(images) == 1 and len(images[0].pixel_values) == tiles
    llm.engine.add_request("r", token_ids, SamplingParams(max_tokens=3), images=images)
    while llm.engine.has_unfinished_requests:
        llm.engine.step()
    pool = llm.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_bench_vision_on_llava_next_agrees_with_transformers(tiny_llava_next_dir):
    _, result = _compared(tiny_llava_next_dir, num_prompts=2)
    # A 64-pixel square: the base tile and a 2 x 2 grid; 16 + 8 x 9 tokens.
    assert (result.tiles_per_image, result.tokens_per_image) == (5, 88)
    assert result.num_identical == 2


def test_random_llava_next_with_a_tied_text_config_agrees_with_transformers(tmp_path):
    # LlavaNextConfig keeps the text config's tie_word_embeddings (SmolLM2's: tied) but unties the
    # model (its own default): the checkpoint holds an lm_head, which must be read, not tied.
    tower = TowerShape(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_llava(tmp_path / "next", tower, 1, 0, next_=True)
    assert _compared(model_dir, num_prompts=2)[1].num_identical == 2


def test_random_qwen2_5_vl_agrees_with_transformers(tmp_path, capsys):
    # Images resized to at most 56 x 56 pixels: 4 x 4 patches of 14, merged into 2 x 2 tokens;
    # M-RoPE in the language model, windows of 112 pixels (one per image) in the tower.
    tower = TowerShape(image_size=56, patch_size=14, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_qwen2_5_vl(tmp_path / "qwen", tower, 1, 0)
    args, result = _compared(model_dir)
    assert (result.tiles_per_image, result.tokens_per_image) == (1, 4)
    assert result.num_identical == 3
    vision.report(args, result)
    assert "one image (4 tokens)" in capsys.readouterr().out


def test_bench_vision_with_videos_agrees_with_transformers(tmp_path, capsys):
    # Videos of 5 frames at 56 x 56 pixels: 3 steps of 2 x 2 tokens.
    tower = TowerShape(image_size=56, patch_size=14, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_qwen2_5_vl(tmp_path / "qwen", tower, 1, 0)
    args, result = _compared(model_dir, 3, "--video-frames", "5")
    assert result.tokens_per_image == 12
    assert result.num_identical == 3
    vision.report(args, result)
    out = capsys.readouterr().out
    assert "one video of 5 frames (12 tokens)" in out and "videos/s" in out
    # Qwen3-VL's: the same steps, each behind its time (frames at 8 a second: 0.1, 0.3 and 0.5
    # seconds) and between its own vision start and end, which transformers reads as text.
    qwen3 = write_random_qwen3_vl(tmp_path / "qwen3", tower, 1, 0)
    _, result = _compared(qwen3, 3, "--video-frames", "5")
    assert result.num_identical == 3
    engine = LLM(model=str(qwen3), device="cpu", kv_cache_memory="16MiB").engine
    [(token_ids, _)] = vision.vision_prompts(engine, 1, 6, 0, 5)
    text = engine.tokenizer.decode(token_ids, skip_special_tokens=False)
    stamps = re.findall(r"<([\d.]+) seconds><\|vision_start\|>((?:<\|video_pad\|>)*)", text)
    assert stamps == [(seconds, "<|video_pad|>" * 4) for seconds in ("0.1", "0.3", "0.5")]
    encode = engine.tokenizer.encode
    stamp_tokens = sum(len(encode(f"<{s} seconds>", add_special_tokens=False)) for s, _ in stamps)
    assert result.tokens_per_image == stamp_tokens + 3 * (1 + 4 + 1)


def test_random_onevision_agrees_with_transformers_on_images_and_videos(tmp_path, capsys):
    # 32-pixel tiles of 8-pixel patches: 16 tokens a tile, 4 a video frame once pooled.
    tower = TowerShape(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_onevision(tmp_path / "onevision", tower, 1, 0)
    assert _compared(model_dir, 2)[1].num_identical == 2
    args, result = _compared(model_dir, 2, "--video-frames", "3")
    assert (result.tokens_per_image, result.num_identical) == (3 * 4 + 1, 2)
    vision.report(args, result)
    assert "one video of 3 frames (13 tokens)" in capsys.readouterr().out


def test_random_gemma3_agrees_with_transformers(tmp_path, capsys):
    # 32-pixel images in 8-pixel patches: 4 x 4 patches pooled 2 x 2 into 4 image tokens,
    # between "\n\n", the image start and end tokens (8 tokens; the seeded text next to it
    # holds no newline to join); the image's tokens see each other.
    tower = TowerShape(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_gemma3(tmp_path / "gemma3", tower, 2, 0)
    args, result = _compared(model_dir)
    assert (result.tiles_per_image, result.tokens_per_image) == (1, 8)
    assert result.num_identical == 3
    vision.report(args, result)
    assert "one image (8 tokens)" in capsys.readouterr().out


def test_random_qwen3_vl_agrees_with_transformers(tmp_path, capsys):
    # Images resized to at most 64 x 64 pixels: 4 x 4 patches of 16, merged into 2 x 2 tokens;
    # position embeddings resampled from 48 x 48 to 4 x 4, DeepStack after both tower layers.
    tower = TowerShape(image_size=64, patch_size=16, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_qwen3_vl(tmp_path / "qwen3", tower, 1, 0)
    _, result = _compared(model_dir)
    assert (result.tiles_per_image, result.tokens_per_image) == (1, 4)
    assert result.num_identical == 3


def test_random_mistral3_agrees_with_transformers(tmp_path, capsys):
    # 64-pixel square images in 8-pixel patches merged 2 x 2: 4 rows of 4 [IMG] tokens, each
    # row ended by a break (the last by the image's end).
    tower = TowerShape(image_size=64, patch_size=8, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_mistral3(tmp_path / "mistral3", tower, 1, 0)
    _, result = _compared(model_dir)
    assert (result.tiles_per_image, result.tokens_per_image) == (1, 20)
    assert result.num_identical == 3
