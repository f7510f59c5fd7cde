"""``spyglass bench embed`` at toy scale on the tiny model: both rows, their ratio and the agreement
of Spyglass's vectors with HF's padded batches; the seeded prompts; a failing HF child."""

import pytest
import torch

from spyglass.core.cli.bench import embed
from spyglass.core.cli.bench.hf_embed import HFEmbedder
from spyglass.core.cli.main import build_parser

TINY = ["--device", "cpu", "--kv-cache-memory", "16MiB", "--num-threads", "1"]


def _rows(out: str) -> dict[str, list[str]]:
    """The table's rows by their first word (spyglass, hf)."""
    rows = [line.split() for line in out.splitlines() if line.startswith(("spyglass  ", "hf ("))]
    return {row[0]: row for row in rows}


@pytest.mark.parametrize(
    ("hf_order", "pooling_type"), [("length", "last"), ("given", "mean"), ("length", "cls")]
)
def test_bench_embed_times_both_sides_and_their_vectors_agree(
    tiny_llama_dir, hf_gguf_tokenizer, capsys, hf_order, pooling_type
):
    # 16-token chunks: the longer prompts are embedded over several steps, beside other prompts.
    argv = ["bench", "embed", "--model", str(tiny_llama_dir), *TINY, "--num-prompts", "7",
            "--min-prompt-len", "3", "--max-prompt-len", "40", "--repeats", "2", "--hf-batch-size", "3",
            "--max-num-batched-tokens", "16", "--hf-order", hf_order,
            "--pooling-type", pooling_type]  # fmt: skip
    args = build_parser(argv).parse_args(argv)
    assert (args.dtype, args.quantization) == ("float32", "none")
    result = embed.compare(args)
    prompts = embed.embed_prompts(len(hf_gguf_tokenizer), 7, 3, 40, seed=0)
    num_tokens = sum(len(p) for p in prompts)
    for side in (result.spyglass, result.hf):
        assert (side.num_prompts, side.num_prompt_tokens) == (7, num_tokens)
        assert side.seconds > 0 and side.prompts_per_s > 0 and side.prompt_tokens_per_s > 0
    assert result.speedup == pytest.approx(result.hf.seconds / result.spyglass.seconds)
    assert result.min_cosine > 0.999
    # HF's batches of 3 (the last one of 1) padded to their longest prompt.
    lengths = [len(p) for p in prompts]
    lengths = sorted(lengths) if hf_order == "length" else lengths
    batches = [lengths[i : i + 3] for i in range(0, 7, 3)]
    assert result.hf_pad_tokens == sum(len(b) * max(b) - sum(b) for b in batches)

    embed.report(args, result)
    out = capsys.readouterr().out
    assert f"embed: 7 prompts of 3 to 40 tokens (seed 0), {num_tokens} prompt tokens" in out
    rows = _rows(out)
    assert set(rows) == {"spyglass", "hf"} and f"(batches of 3, {hf_order} order)" in out
    assert float(rows["spyglass"][-1]) == pytest.approx(
        result.spyglass.prompt_tokens_per_s, abs=0.1
    )
    assert float(rows["hf"][-2]) == pytest.approx(result.hf.prompts_per_s, abs=0.1)
    assert f"spyglass / hf embedding throughput: {result.speedup:.2f}x" in out
    assert f"min cosine similarity {result.min_cosine:.6f} over 7 prompts" in out


def test_embed_prompts_are_seeded_and_within_the_lengths():
    prompts = embed.embed_prompts(1000, 50, 16, 24, seed=3)
    assert prompts == embed.embed_prompts(1000, 50, 16, 24, seed=3)
    assert prompts != embed.embed_prompts(1000, 50, 16, 24, seed=4)
    assert {len(p) for p in prompts} <= set(range(16, 25)) and len({len(p) for p in prompts}) > 1
    assert all(100 <= token < 1000 for p in prompts for token in p)


def test_hf_embedder_reports_the_child_failure():
    with pytest.raises(RuntimeError, match="HF embedding failed"):
        HFEmbedder("/nonexistent/model.gguf", torch.float32, [[101, 102]], 1, True)
