"""The ``spyglass`` command: each subcommand lives in its own module, imported only when it is run.

``spyglass --help`` imports no command module; ``spyglass serve --help`` imports only the serve
command's parser, which keeps its heavy imports (torch, the engine, the HTTP stack) inside ``run``.
"""

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from spyglass.core.cli.startup import collector_paused

# name -> (module with add_parser(subparsers), one-line help)
COMMANDS = {
    "generate": ("spyglass.core.cli.generate", "stream a chat answer to one prompt"),
    "serve": ("spyglass.core.cli.serve_command", "serve the OpenAI-compatible HTTP API"),
    "run-batch": (
        "spyglass.core.cli.run_batch",
        "answer a JSONL file of requests in OpenAI's batch format",
    ),
    "bench": ("spyglass.core.cli.bench.cli_bench", "run a benchmark"),
    "plugins": ("spyglass.core.cli.plugins", "list loaded plugins and their hooks"),
}


def add_subcommands(subparsers, commands: dict[str, tuple[str, str]], argv: Sequence[str]) -> None:
    """A subparser per entry of ``commands``; only the one ``argv`` names is imported and built in full.

    Its module's ``add_parser(subparsers, argv)`` gets the arguments after its name, for commands
    with subcommands of their own (``bench``); the others are listed with their help alone.
    """
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, help_text) in commands.items():
        if name == chosen:
            importlib.import_module(module).add_parser(
                subparsers, argv[list(argv).index(name) + 1 :]
            )
        else:
            subparsers.add_parser(name, help=help_text, add_help=False)


def add_log_requests_argument(parser: argparse.ArgumentParser, why_off: str) -> None:
    """``--log-requests``: keep the per-request log lines, which the command quiets by default
    (``why_off`` says why, in its help)."""
    parser.add_argument(
        "--log-requests",
        dest="quiet_loggers",
        action="store_const",
        const=(),
        default=("spyglass.requests",),
        help=f"keep the per-request log lines (off by default: {why_off})",
    )


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The top-level parser, with the full subparser of the command ``argv`` names."""
    parser = argparse.ArgumentParser(
        prog="spyglass", description="An observability-first LLM serving engine."
    )
    add_subcommands(parser.add_subparsers(dest="command", required=True), COMMANDS, argv)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    argv = sys.argv[1:] if argv is None else argv
    with collector_paused():
        args = build_parser(argv).parse_args(argv)
        from spyglass.telemetry.logging import setup_logging

        # One log schema for every command (JSON lines unless stderr is a terminal); stdout stays the command's.
        setup_logging(stream=sys.stderr)
    # a command's own choice (bench: no per-request lines)
    for name in getattr(args, "quiet_loggers", ()):
        logging.getLogger(name).setLevel(logging.WARNING)
    return args.run(args) or 0


if __name__ == "__main__":
    raise SystemExit(main())
