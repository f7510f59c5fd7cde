"""``spyglass run-batch -i requests.jsonl -o results.jsonl [MODEL]``: answer a file of requests in
OpenAI's batch format offline, with the server's routes and checks but no server (vLLM's
``run-batch``)."""

import asyncio
import logging
import sys
from contextlib import ExitStack

from spyglass.core.api.server_options import ServerOptions
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.cli.main import add_log_requests_argument
from spyglass.core.cli.startup import collector_paused
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.cli_options import add_telemetry_arguments, settings_from_args

log = logging.getLogger("spyglass.batch")


def add_parser(subparsers, argv) -> None:
    """Register the command."""
    parser = subparsers.add_parser(
        "run-batch", help="answer a JSONL file of requests in OpenAI's batch format"
    )
    parser.add_argument(
        "model_positional",
        nargs="?",
        metavar="MODEL",
        help="GGUF file or HF directory (overrides --model)",
    )
    parser.add_argument(
        "-i",
        "--input-file",
        required=True,
        help='the batch file: one {"custom_id", "method", "url", "body"} per line (- for stdin)',
    )
    parser.add_argument(
        "-o",
        "--output-file",
        required=True,
        help="where the answers go, one line per request, in the input's order (- for stdout)",
    )
    defaults = ServerOptions()
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=256,
        help="the most requests in flight at once (the others wait their turn)",
    )
    parser.add_argument(
        "--enable-metrics",
        action="store_true",
        help="serve the API on --host:--port while the batch runs, for Prometheus to scrape "
        "/metrics (vLLM's option)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="with --enable-metrics")
    parser.add_argument("--port", type=int, default=8000, help="with --enable-metrics")
    parser.add_argument("--served-model-name", default=None, help="the model name bodies use")
    parser.add_argument(
        "--tool-call-parser", default=defaults.tool_call_parser, metavar="NAME", help="as serve's"
    )
    parser.add_argument("--reasoning-parser", default=None, metavar="NAME", help="as serve's")
    add_log_requests_argument(parser, "one per line of the batch")
    add_engine_arguments(parser)
    add_telemetry_arguments(parser)
    parser.set_defaults(run=run)


def run(args) -> int:
    """Load the engine, answer every line, and say how many succeeded."""
    if args.model_positional:
        args.model = args.model_positional
    if args.max_concurrency < 1:
        print("spyglass run-batch: --max-concurrency must be at least 1", file=sys.stderr)
        return 2
    telemetry = settings_from_args(args)
    telemetry_settings.configure(telemetry)
    options = ServerOptions(
        served_model_name=args.served_model_name,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        max_queued_requests=max(args.max_concurrency, ServerOptions().max_queued_requests),
        responses_store_size=0,  # nothing continues a batch's responses
        chat_completions_store_size=0,  # nor lists its chat completions
        conversations_store_size=0,  # nor continues conversations
        batches_store_size=0,  # it is the batch
    )
    engine_config = engine_config_from_args(args, telemetry=telemetry)
    with collector_paused():
        from spyglass.core.api.app import create_app
        from spyglass.core.api.batch_file import run_batch
        from spyglass.core.loaders.hf_loader import check_supported

    try:  # a model that cannot load is a one-line answer, as serve's
        if args.model:
            check_supported(args.model)
    except ValueError as error:
        print(f"spyglass run-batch: {error}", file=sys.stderr)
        return 2

    with ExitStack() as files:
        source = sys.stdin if args.input_file == "-" else files.enter_context(open(args.input_file))
        sink = (
            sys.stdout
            if args.output_file == "-"
            else files.enter_context(open(args.output_file, "w"))
        )
        total = _count_lines(source)
        step = max(1, (total or 10_000) // 10)

        def progress(count: int) -> None:
            if count % step == 0 or count == total:
                log.info("batch: %d of %s requests answered", count, total or "?")

        app = create_app(engine_config, options)
        try:  # the lines are read as workers take them: a large file is never held whole
            listen = (args.host, args.port) if args.enable_metrics else None
            summary = asyncio.run(
                run_batch(app, source, sink, args.max_concurrency, progress, listen)
            )
        except (ValueError, OSError, BaseExceptionGroup) as failed:
            cause = _first_cause(failed)
            if not isinstance(cause, (ValueError, OSError)):
                raise
            # The engine could not load (the model, its files), or the port is taken: one line.
            print(f"spyglass run-batch: {cause}", file=sys.stderr)
            return 2
    log.info(
        "batch done: %d succeeded, %d failed, %d not sent",
        summary.succeeded,
        summary.failed,
        summary.not_sent,
    )
    return 0


def _first_cause(error: BaseException) -> BaseException:
    """``error``, or the first error of a group (the app's start-up raises its error in one)."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def _count_lines(source) -> int | None:
    """How many requests a batch file holds (None for a stream that cannot be read twice)."""
    if not source.seekable():
        return None
    total = sum(1 for line in source if line.strip())
    source.seek(0)
    return total
