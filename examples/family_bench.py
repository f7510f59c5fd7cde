"""W1 on a small random checkpoint of every supported family, each the same size as its Llama.

Each family gets the same shape (hidden 256, 4 layers, 4 query / 2 KV heads of 64, MLP 768; MoE
families 4 experts of 384 with top-2, so the active MLP width matches) and the default model's
tokenizer, built by transformers from a config, saved, and loaded through Spyglass's real loader.
Families run interleaved, ``--repeats`` times, on fresh engines; the median of each is printed with
its ratio to Llama. Sliding-window families get a 128-token window, which W1's 256-token sequences
cross.

    python examples/family_bench.py [--num-requests 16] [--repeats 3] [--num-threads N]
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
import transformers

from spyglass.core.cli.bench.throughput import run_engine
from spyglass.core.cli.bench.workloads import WORKLOADS
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.loaders.default_model import ensure_default_model

SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=768,
    max_position_embeddings=4096,
)
WINDOW = 128
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=384)
# family -> (config class, model class, options beyond SHAPE)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(sliding_window=WINDOW, query_pre_attn_scalar=64),
    ),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(sliding_window=WINDOW)),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=384),
    ),
    "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(num_experts=4, **MOE)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4, **MOE)),
}


def build(family: str, root: Path, tokenizer) -> Path:
    """Save a random checkpoint of ``family`` with the default model's tokenizer; its directory."""
    config_class, model_class, options = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        **{**SHAPE, **options}, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2
    )
    path = root / family
    getattr(transformers, model_class)(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument("--families", default=",".join(FAMILIES))
    args = parser.parse_args()
    families = args.families.split(",")
    gguf = ensure_default_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with tempfile.TemporaryDirectory() as scratch:
        paths = {family: build(family, Path(scratch), tokenizer) for family in families}
        workload = WORKLOADS["w1"](len(tokenizer), args.num_requests)
        seconds: dict[str, list[float]] = {family: [] for family in families}
        for repeat in range(args.repeats):
            for family in families[repeat % len(families) :] + families[: repeat % len(families)]:
                config = EngineConfig(
                    model=str(paths[family]),
                    dtype="float32",
                    num_threads=args.num_threads,
                    plugins=["fcfs"],
                )
                engine = LLMEngine(config)
                seconds[family].append(run_engine(engine, workload).seconds)
                engine.shutdown()
    num_output = sum(request.output_len for request in workload)
    baseline = statistics.median(seconds[families[0]])
    print(f"W1, {len(workload)} requests, {num_output} output tokens, median of {args.repeats}")
    print(f"{'family':<10} {'seconds':>8} {'out tok/s':>10} {'vs ' + families[0]:>10}")
    for family in families:
        median = statistics.median(seconds[family])
        print(f"{family:<10} {median:8.2f} {num_output / median:10.1f} {baseline / median:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
