"""vLLM's command-line options as Spyglass takes them, so that a ``vllm serve`` line carries over.

Some map onto Spyglass's own (``--enforce-eager`` is ``--no-cuda-graphs``, set where that option
is declared; ``--enable-prefix-caching`` turns the ``prefix_cache`` plugin on or off); some ask
for what Spyglass always does and are accepted (``--trust-remote-code``: no checkpoint code ever
runs here, the architectures served are built in); the rest have no meaning here and end the
command with what to use instead, never a silent no-op.
"""

import argparse

REFUSED = {
    "--gpu-memory-utilization": "size the KV cache with --kv-cache-memory (e.g. 40GiB): the "
    "weights and activations come on top",
    "--swap-space": "preempted requests are recomputed, never swapped to host memory",
    "--cpu-offload-gb": "weights are never offloaded",
    "--pipeline-parallel-size": "only tensor parallelism is served: --tensor-parallel-size",
    "--speculative-config": "use --speculative ngram|draft|self and --num-speculative-tokens "
    "(a draft model through --plugin-option draft_model=PATH)",
    "--tokenizer": "the tokenizer is the model directory's (or the GGUF file's)",
    "--revision": "there is no model hub here: serve a local directory or GGUF file",
    "--download-dir": "there is no model hub here: serve a local directory or GGUF file",
}


class RefusedFlag(argparse.Action):
    """A vLLM option with no meaning here: naming it ends the command with ``hint``."""

    def __init__(self, option_strings, dest, hint: str, **kwargs):
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)
        self.hint = hint

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is vLLM's option, not taken here: {self.hint}")


def add_vllm_arguments(group) -> None:
    """vLLM's options to an argument group: those taken, and those refused with a hint."""
    group.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM's switch for the prefix_cache plugin (on unless disabled)",
    )
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted for vLLM's command lines: no checkpoint code ever runs here",
    )
    for flag, hint in REFUSED.items():
        group.add_argument(flag, action=RefusedFlag, hint=hint, dest=argparse.SUPPRESS)


def plugin_choice(
    args: argparse.Namespace,
) -> tuple[list[str] | None, list[str]]:
    """``(plugins, disabled_plugins)`` from ``--plugins`` and ``--disable-plugins`` with vLLM's
    ``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` applied."""
    plugins = [p for p in args.plugins.split(",") if p] if args.plugins is not None else None
    disabled = [p for p in args.disable_plugins.split(",") if p]
    if args.enable_prefix_caching is False and "prefix_cache" not in disabled:
        disabled.append("prefix_cache")
    elif args.enable_prefix_caching:
        if "prefix_cache" in disabled:
            raise ValueError("--enable-prefix-caching and --disable-plugins prefix_cache disagree")
        if plugins is not None and "prefix_cache" not in plugins:
            plugins.append("prefix_cache")
    return plugins, disabled
