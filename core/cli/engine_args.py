"""Command-line options shared by every command that starts an engine."""

import argparse
import json
import sys

from spyglass.core.cli.vllm_flags import add_vllm_arguments, plugin_choice
from spyglass.core.engine.config import KV_CACHE_DTYPES, QUANTIZATIONS, EngineConfig, parse_bytes
from spyglass.core.models.model_config import POOLING_TYPES


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that map onto `EngineConfig` fields."""
    defaults = EngineConfig()
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--model", default=None, help="GGUF file or HF directory (default: SmolLM2-135M-Instruct)"
    )
    group.add_argument(
        "--dtype", default=defaults.dtype, choices=["auto", "float32", "bfloat16", "float16"]
    )
    group.add_argument("--device", default=defaults.device, help="auto, cpu or cuda")
    group.add_argument(
        "--quantization",
        default=defaults.quantization,
        choices=QUANTIZATIONS,
        help="auto: keep a GGUF file's Q4_0/Q4_1/Q8_0 blocks on the CPU; none: dequantize; int8: "
        "weight-only int8; dual: blocks for steps of under 8 rows, a bf16 copy for bigger ones "
        "(bf16 only; 1.7-1.9x throughput on AMX CPUs, for memory and bit-for-bit reproducibility)",
    )
    group.add_argument(
        "--pooling-type",
        default=None,
        choices=POOLING_TYPES,
        help="how embeddings pool the prompt's final hidden states: the last token's, their mean "
        "or the first token's (default: the checkpoint's sentence-transformers config, else last)",
    )
    group.add_argument(
        "--limit-mm-per-prompt",
        type=json.loads,
        default={},
        help="the most images and videos a prompt may hold, as vLLM takes it: "
        '\'{"image": 4, "video": 1}\' (default: as many as the context holds)',
    )
    group.add_argument(
        "--media-io-kwargs",
        type=json.loads,
        default={},
        help='how media are read, as vLLM takes it: \'{"video": {"num_frames": 16}}\', the most '
        "frames read from a video file, evenly spaced (default 32)",
    )
    group.add_argument(
        "--mm-processor-kwargs",
        type=json.loads,
        default={},
        help="a vision model's image processor settings for every request, as vLLM takes them: "
        "Qwen2-VL's '{\"max_pixels\": 802816}' (and min_pixels), Idefics3's "
        "'{\"do_image_splitting\": false}'",
    )
    group.add_argument(
        "--generation-config",
        default="auto",
        help="where requests' sampling defaults come from, as vLLM takes it: auto (the model "
        "directory's generation_config.json: temperature, top_p, top_k, min_p, "
        "repetition_penalty, max_new_tokens), vllm (none: the API's own), or a directory "
        "holding a generation_config.json",
    )
    group.add_argument(
        "--chat-template",
        default=None,
        help="the chat template to render chats with instead of the model's: a file, or the "
        "jinja template itself",
    )
    group.add_argument(
        "--override-generation-config",
        type=json.loads,
        default={},
        help="generation config keys set on top, e.g. '{\"temperature\": 0.5}'",
    )
    group.add_argument(
        "--image-cache-tokens",
        type=int,
        default=defaults.image_cache_tokens,
        help="embeddings of recently encoded images kept for other requests with the same image "
        "(a vision model's; 0: none)",
    )
    group.add_argument("--max-model-len", type=int, default=None)
    group.add_argument("--block-size", type=int, default=defaults.block_size)
    group.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    group.add_argument(
        "--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens
    )
    group.add_argument(
        "--kv-cache-memory", default="2GiB", help="KV cache budget, e.g. 2GiB or 512MiB"
    )
    group.add_argument(
        "--kv-cache-dtype",
        default=defaults.kv_cache_dtype,
        choices=KV_CACHE_DTYPES,
        help="auto: the model's dtype; float16: half the bytes for a float32 model on the CPU",
    )
    group.add_argument("--policy", dest="scheduling_policy", default=defaults.scheduling_policy)
    group.add_argument(
        "--attention-backend",
        default=defaults.attention_backend,
        choices=["auto", "cpu", "torch", "triton"],
    )
    group.add_argument(
        "--plugins", default=None, help="comma-separated plugin names to enable (default: all)"
    )
    group.add_argument(
        "--disable-plugins", default="", help="comma-separated plugin names to disable"
    )
    group.add_argument(
        "--no-cuda-graphs",
        "--enforce-eager",
        dest="cuda_graphs",
        action="store_false",
        help="run decode eagerly (--enforce-eager: vLLM's name)",
    )
    group.add_argument(
        "--cuda-graph-tokens",
        type=int,
        default=defaults.cuda_graph_tokens,
        help="replay steps of up to this many new tokens that are not plain decode (a prompt chunk "
        "among decodes) from CUDA graphs too; 0: eagerly (default)",
    )
    group.add_argument(
        "--async-output",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="emit a step's outputs while the device runs the next (default: on with CUDA)",
    )
    group.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also schedule and launch each step before the previous one's tokens reach the host "
        "(turns async output on; not with --speculative; default: on with CUDA for one process "
        "without speculation)",
    )
    group.add_argument(
        "--stream-interval",
        type=int,
        default=defaults.stream_interval,
        help="tokens per streamed output at most: a request's first token goes out at once, then "
        "one output per this many tokens, and its last (fewer outputs to build, send and write; "
        "vLLM's option)",
    )
    group.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    group.add_argument(
        "--speculative", default=None, help="draft proposer plugin: ngram, draft or self"
    )
    group.add_argument(
        "--num-speculative-tokens", type=int, default=defaults.num_speculative_tokens
    )
    group.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=defaults.tensor_parallel_size,
        help="processes to split the model over (heads, MLP, vocabulary); gloo on the CPU, NCCL on CUDA",
    )
    group.add_argument(
        "--enable-lora", action="store_true", help="let requests run with LoRA adapters (PEFT)"
    )
    group.add_argument(
        "--lora-modules",
        nargs="+",
        type=lora_module,
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters to load at start; requests name one as their model (needs --enable-lora)",
    )
    group.add_argument(
        "--max-lora-rank",
        type=int,
        default=defaults.max_lora_rank,
        help="the largest adapter rank accepted",
    )
    group.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help="the most distinct LoRA adapters in the running batch (default: no limit)",
    )
    group.add_argument(
        "--plugin-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a plugin setting, e.g. draft_model=PATH or self_draft_layers=8 (repeatable)",
    )
    add_vllm_arguments(parser.add_argument_group("vLLM's options"))


def lora_module(value: str) -> tuple[str, str]:
    """``NAME=PATH``, or vLLM's JSON form ``{"name": ..., "path": ...}``, as ``(name, path)``."""
    if value.lstrip().startswith("{"):
        try:
            spec = json.loads(value)
            return spec["name"], spec["path"]
        except (ValueError, KeyError, TypeError):
            raise argparse.ArgumentTypeError(
                f'{value!r} is not {{"name": ..., "path": ...}}'
            ) from None
    name, equals, path = value.partition("=")
    if not (name and equals and path):
        raise argparse.ArgumentTypeError(f"{value!r} is not NAME=PATH")
    return name, path


def engine_config_from_args(args: argparse.Namespace, **overrides) -> EngineConfig:
    """An `EngineConfig` from parsed engine options, with ``overrides`` applied last.

    A value the config refuses (``--stream-interval 0``) ends the command as a usage error does:
    its message on stderr and exit status 2, not a traceback."""
    try:
        plugins, disabled_plugins = plugin_choice(args)
    except ValueError as error:
        print(f"spyglass: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    options = dict(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        quantization=args.quantization,
        pooling_type=args.pooling_type,
        limit_mm_per_prompt=args.limit_mm_per_prompt,
        image_cache_tokens=args.image_cache_tokens,
        mm_processor_kwargs=args.mm_processor_kwargs,
        media_io_kwargs=args.media_io_kwargs,
        generation_config=args.generation_config,
        override_generation_config=args.override_generation_config,
        chat_template=args.chat_template,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory=parse_bytes(args.kv_cache_memory),
        kv_cache_dtype=args.kv_cache_dtype,
        scheduling_policy=args.scheduling_policy,
        attention_backend=args.attention_backend,
        plugins=plugins,
        disabled_plugins=disabled_plugins,
        num_threads=args.num_threads,
        cuda_graphs=args.cuda_graphs,
        cuda_graph_tokens=args.cuda_graph_tokens,
        async_output=args.async_output,
        async_scheduling=args.async_scheduling,
        stream_interval=args.stream_interval,
        speculative=args.speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        tensor_parallel_size=args.tensor_parallel_size,
        plugin_options=dict(option.split("=", 1) for option in args.plugin_option),
        enable_lora=args.enable_lora,
        max_lora_rank=args.max_lora_rank,
        max_loras=args.max_loras,
        lora_modules=dict(args.lora_modules),
    )
    options.update(overrides)
    try:
        return EngineConfig(**options)
    except ValueError as error:
        print(f"spyglass: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
