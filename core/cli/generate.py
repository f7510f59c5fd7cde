"""``spyglass generate "prompt"``: stream one chat answer to the terminal."""

import sys

from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.cli.startup import collector_paused


def add_parser(subparsers, argv) -> None:
    """Register the command."""
    parser = subparsers.add_parser("generate", help="stream a chat answer to one prompt")
    parser.add_argument("prompt")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--no-chat-template", action="store_true", help="send the prompt as raw text"
    )
    add_engine_arguments(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    """Load the engine and print tokens as they are generated."""
    # Imported here, not at the top, so ``spyglass generate --help`` does not load torch.
    with collector_paused():
        from spyglass.core.engine.engine import LLMEngine
        from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams

        engine = LLMEngine(engine_config_from_args(args))
    tokenizer = engine.tokenizer
    prompt = args.prompt
    if not args.no_chat_template:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    params = SamplingParams(
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        seed=args.seed,
        output_kind=RequestOutputKind.DELTA,
    )
    engine.add_request("cli", tokenizer.encode(prompt), params, prompt=prompt)
    while engine.has_unfinished_requests:
        for output in engine.step():
            sys.stdout.write(output.outputs[0].text)
            sys.stdout.flush()
    sys.stdout.write("\n")
    engine.shutdown()
    return 0
