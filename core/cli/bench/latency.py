"""``spyglass bench latency --speculative ngram,self``: batch-1 decode speed with and without speculation.

Two workloads: one that copies from its input (rewrite a paragraph, edit code) and one open-ended.
Every method runs the same greedy requests one at a time, interleaved over ``--repeats`` rounds;
the table gives median ms per output token, the speed-up over no speculation, the acceptance
rate and whether the output equals the non-speculative output token for token. The method
``ngram+prediction`` is n-gram speculation with each copy prompt's text to keep as its predicted
output (OpenAI's predicted outputs, `SamplingParams.prediction`); open prompts have none.
"""

import statistics
import sys
import time

from spyglass.core.cli.bench.verify_cost import print_costs, verification_costs
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams

PARAGRAPH = (
    "Observability means being able to ask new questions of a running system without shipping new code. "
    "For a language model server, that means seeing how long each request waited, how its prompt was split "
    "into chunks, which blocks of the key-value cache it used, and why it finished when it did."
)
CODE = (
    "def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
    "    return total / len(values)\n"
)
PREDICTION = "+prediction"
WORKLOADS = {
    "copy": [
        f"Rewrite this paragraph, keeping every sentence but fixing nothing:\n\n{PARAGRAPH}",
        f"Add a docstring to this function and return the whole function:\n\n{CODE}",
    ],
    "open": [
        "Write a short story about a lighthouse keeper.",
        "Explain how a bicycle stays upright.",
    ],
}


PREDICTED = {WORKLOADS["copy"][0]: PARAGRAPH, WORKLOADS["copy"][1]: CODE}
"""What each copy prompt's answer is expected to repeat: its prediction under ``ngram+prediction``."""


class SpecCounter:
    """Collects draft and acceptance counts of finished requests through the public hooks."""

    def __init__(self):
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    @hookimpl
    def spyglass_request_finished(self, request, reason):
        """Add the request's speculation counts."""
        self.num_draft_tokens += request.num_draft_tokens
        self.num_accepted_tokens += request.num_accepted_tokens


def add_parser(subparsers, argv) -> None:
    """Register ``bench latency``."""
    parser = subparsers.add_parser(
        "latency", help="batch-1 decode latency, with and without speculation"
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--verify-cost",
        action="store_true",
        help="also time steps verifying 0..K drafts (K = --num-speculative-tokens) with the first "
        "--speculative method's engine",
    )
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


def _chat_token_ids(engine: LLMEngine, prompt: str) -> list[int]:
    """``prompt`` as one user turn in the model's chat template, tokenized."""
    return engine.tokenizer.encode(
        engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    )


def _generate(
    engine: LLMEngine, prompt: str, max_tokens: int, predict: bool
) -> tuple[float, list[int]]:
    """Seconds per output token after the first, and the output, of one greedy request (with
    ``predict``, the prompt's `PREDICTED` text, if any, as its prediction)."""
    token_ids = _chat_token_ids(engine, prompt)
    predicted = PREDICTED.get(prompt) if predict else None
    engine.add_request(
        f"latency-{time.monotonic_ns()}",
        token_ids,
        SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.DELTA,
            prediction=None if predicted is None else engine.tokenizer.encode(predicted, False),
        ),
    )
    start = time.perf_counter()
    first = None
    output_ids: list[int] = []
    while engine.has_unfinished_requests:
        for output in engine.step():
            first = first or time.perf_counter()
            output_ids += output.outputs[0].token_ids
    decode_seconds = time.perf_counter() - (first or start)
    return decode_seconds / max(len(output_ids) - 1, 1), output_ids


def run(args) -> int:
    """One engine per method, the workloads interleaved across repeats; print the table."""
    methods = [None] + [m for m in (args.speculative or "").split(",") if m]
    if args.verify_cost and len(methods) == 1:
        print("bench latency: --verify-cost needs a --speculative method", file=sys.stderr)
        return 2
    engines, counters = {}, {}
    for method in methods:
        speculative = None if method is None else method.removesuffix(PREDICTION)
        engines[method] = LLMEngine(engine_config_from_args(args, speculative=speculative))
        counters[method] = {name: SpecCounter() for name in WORKLOADS}
    samples = {(m, w): [] for m in methods for w in WORKLOADS}
    outputs = {}
    for _ in range(args.repeats):
        for workload, prompts in WORKLOADS.items():
            for method, engine in engines.items():
                counter = counters[method][workload]
                engine.plugin_manager.register(counter)
                for index, prompt in enumerate(prompts):
                    predict = method is not None and method.endswith(PREDICTION)
                    per_token, ids = _generate(engine, prompt, args.max_tokens, predict)
                    samples[method, workload].append(per_token)
                    outputs[method, workload, index] = ids
                engine.plugin_manager.unregister(counter)
    first = engines[None]
    print(
        f"model {first.model_name} dtype {first.info.dtype} kv cache {first.info.kv_cache_dtype} "
        f"k={args.num_speculative_tokens} batch 1, "
        f"{args.max_tokens} tokens, median of {args.repeats} rounds"
    )
    print(
        f"{'workload':<9}{'method':<17}{'ms/token':>10}{'speed-up':>10}{'accepted':>10}{'identical':>11}"
    )
    for workload, prompts in WORKLOADS.items():
        base = statistics.median(samples[None, workload])
        for method in methods:
            median = statistics.median(samples[method, workload])
            counter = counters[method][workload]
            rate = (
                counter.num_accepted_tokens / counter.num_draft_tokens
                if counter.num_draft_tokens
                else 0.0
            )
            same = all(
                outputs[method, workload, i] == outputs[None, workload, i]
                for i in range(len(prompts))
            )
            print(
                f"{workload:<9}{method or 'none':<17}{median * 1e3:>10.1f}{base / median:>9.2f}x"
                f"{rate:>10.0%}{'yes' if same else 'NO':>11}"
            )
    if args.verify_cost:
        engine = engines[methods[1]]
        token_ids = _chat_token_ids(engine, WORKLOADS["copy"][0])
        costs = verification_costs(engine, token_ids, args.num_speculative_tokens, args.repeats)
        print_costs(costs)
    return 0
