"""``spyglass bench vision`` at toy scale: on the tiny LLaVA both sides time the same prompts and
give the same greedy tokens; a random LLaVA it builds loads and runs."""

from pathlib import Path

import pytest

from spyglass.core.cli.bench import vision
from spyglass.core.cli.bench.random_llava import TowerShape, write_random_llava
from spyglass.core.cli.main import build_parser
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM

TINY = ["--device", "cpu", "--kv-cache-memory", "16MiB", "--num-threads", "1"]


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


def test_the_random_llava_loads_and_reads_images(tmp_path):
    tower = TowerShape(image_size=32, patch_size=16, hidden_size=32, num_layers=2, num_heads=2)
    model_dir = write_random_llava(tmp_path / "llava", tower, text_layers=1, seed=0)
    llm = LLM(model=str(model_dir), dtype="float32", device="cpu", kv_cache_memory="32MiB")
    assert llm.engine.arch.vision.tokens_per_tile == 4
    assert llm.engine.arch.num_hidden_layers == 1
    [(token_ids, images)] = vision.vision_prompts(llm.engine, 1, 6, seed=3)
    assert token_ids.count(llm.engine.arch.vision.image_token_id) == 4 and len(images) == 1
    llm.engine.add_request(
        "r", token_ids, SamplingParams(max_tokens=3, ignore_eos=True), images=images
    )
    outputs = []
    while llm.engine.has_unfinished_requests:
        outputs += [o for o in llm.engine.step() if o.finished]
    assert len(outputs[0].outputs[0].token_ids) == 3
