"""The ``spyglass`` command: each subcommand lives in its own module and registers itself here."""

import argparse
import sys

from spyglass.core import cli_generate, cli_plugins
from spyglass.core.api import serve_command
from spyglass.core.bench import cli_bench
from spyglass.telemetry.logging import setup_logging

COMMANDS = (cli_generate, serve_command, cli_bench, cli_plugins)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command module."""
    parser = argparse.ArgumentParser(prog="spyglass", description="An observability-first LLM serving engine.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    # One log schema for every command (JSON lines unless stderr is a terminal); stdout stays the command's.
    setup_logging(stream=sys.stderr)
    args = build_parser().parse_args(argv)
    return args.run(args) or 0


if __name__ == "__main__":
    raise SystemExit(main())
