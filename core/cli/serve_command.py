"""``spyglass serve [MODEL]``: the OpenAI-compatible HTTP server."""

import argparse
import os
import sys

from spyglass.core.api.server_options import ServerOptions
from spyglass.core.cli.engine_args import add_engine_arguments, engine_config_from_args
from spyglass.core.cli.startup import collector_paused
from spyglass.core.engine.config import EngineConfig, parse_bytes
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.cli_options import add_telemetry_arguments, settings_from_args


def add_parser(subparsers, argv) -> None:
    """Register the command."""
    parser = subparsers.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    parser.add_argument(
        "model_positional",
        nargs="?",
        metavar="MODEL",
        help="GGUF file or HF directory (overrides --model)",
    )
    defaults = ServerOptions()
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=defaults.host)
    group.add_argument("--port", type=int, default=defaults.port)
    group.add_argument(
        "--api-key",
        default=os.environ.get("SPYGLASS_API_KEY"),
        help="require this bearer key (env SPYGLASS_API_KEY)",
    )
    group.add_argument(
        "--metrics-require-key", action="store_true", help="put /metrics behind the API key too"
    )
    group.add_argument(
        "--max-body-bytes", default="4MiB", help="largest request body; bigger ones get a 413"
    )
    group.add_argument(
        "--allowed-media-domains",
        default="",
        help="hosts whose http(s) image URLs a vision model's requests may name, comma-separated "
        "(* for any); by default the server fetches nothing and images come as data: URLs",
    )
    group.add_argument(
        "--media-fetch-timeout",
        type=float,
        default=defaults.media_fetch_timeout,
        help="seconds an image URL's fetch may take",
    )
    group.add_argument(
        "--max-media-bytes", default="20MiB", help="largest image an image URL may fetch"
    )
    group.add_argument(
        "--max-queued-requests",
        type=int,
        default=defaults.max_queued_requests,
        help="answer 429 while this many requests wait in the engine queue",
    )
    group.add_argument(
        "--responses-store-size",
        type=int,
        default=defaults.responses_store_size,
        metavar="N",
        help=f"keep the last N Responses API responses in memory, for previous_response_id and "
        f"GET /v1/responses/{{id}} (default {defaults.responses_store_size}; 0 keeps none; behind "
        "--replicas, each replica keeps N of its own and the router sends what follows a response "
        "to the replica that keeps it)",
    )
    group.add_argument(
        "--conversations-store-size",
        type=int,
        default=defaults.conversations_store_size,
        metavar="N",
        help="keep the last N conversations used (POST /v1/conversations, a Responses call's "
        f"conversation) in memory (default {defaults.conversations_store_size}; 0 keeps none; "
        "behind --replicas, each replica keeps N of its own and the router sends every call about "
        "one to the replica that keeps it)",
    )
    group.add_argument(
        "--batches-store-size",
        type=int,
        default=None,
        metavar="N",
        help="keep the last N files (batch inputs and results) and the last N batches of OpenAI's "
        f"Batch API in memory (default {defaults.batches_store_size}; 0 keeps none; an upload is "
        "at most --max-body-bytes; none behind --replicas, where a file and its batch could "
        "reach different replicas)",
    )
    group.add_argument(
        "--chat-completions-store-size",
        type=int,
        default=None,
        metavar="N",
        help="keep the last N chat completions made with store: true in memory, for GET "
        f"/v1/chat/completions (default {defaults.chat_completions_store_size}; 0 keeps none, and "
        "store: true is then a 400; none behind --replicas, where a list would show one "
        "replica's)",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=float,
        default=defaults.shutdown_timeout,
        help="seconds in-flight requests get to finish after SIGTERM before they are aborted",
    )
    group.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: the model's)",
    )
    group.add_argument(
        "--disable-access-log", action="store_true", help="do not log every HTTP request"
    )
    group.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated origins allowed by CORS, or * (default: CORS off)",
    )
    group.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the engine (its plugins and telemetry too) in a process of its own, so that the "
        "HTTP server's work does not share its interpreter lock (vLLM's layout; default: on when "
        "the engine runs on CUDA)",
    )
    group.add_argument(
        "--allow-runtime-lora",
        action="store_true",
        help="open /v1/load_lora_adapter and /v1/unload_lora_adapter (they read paths on this "
        "machine: for trusted clients)",
    )
    group.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let chat, tokenize and embeddings requests bring a chat template of their own "
        "(chat_template; templates run sandboxed, but they are code)",
    )
    group.add_argument(
        "--reasoning-parser",
        default=None,
        metavar="NAME",
        help="split chat and Responses answers into reasoning_content and content: deepseek_r1 "
        "or qwen3 (<think>...</think>), mistral (Magistral's [THINK]...[/THINK]), or a plugin's "
        "format",
    )
    group.add_argument(
        "--tool-call-parser",
        default="hermes",
        metavar="NAME",
        help="the format tool calls are parsed from when a request leaves the choice to the "
        "model (tool_choice auto): hermes (<tool_call>{...}</tool_call>; the default), "
        'llama3_json (Llama 3.1-3.3: {"name": ..., "parameters": {...}}), mistral '
        "([TOOL_CALLS]...), qwen3_coder (<function=...><parameter=...>), pythonic ([f(a=1), ...]), "
        "phi4_mini_json (functools[...]), or a "
        "plugin's format "
        "(hook spyglass_tool_call_parser)",
    )
    group.add_argument(
        "--seed",
        type=int,
        default=EngineConfig().seed,
        help="the seed of the sampling of requests that bring none (vLLM's option)",
    )
    group.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accepted for vLLM's command lines: tool_choice auto is always served, its answers "
        "read by --tool-call-parser",
    )
    replicas = parser.add_argument_group("replicas (Ray Serve; needs the ray extra)")
    replicas.add_argument(
        "--replicas",
        type=int,
        default=0,
        metavar="N",
        help="serve N engine replicas on Ray Serve behind one ingress on --host:--port, routed by "
        "prompt prefix (default 0: one engine in this process, no Ray)",
    )
    replicas.add_argument(
        "--replica-port",
        type=int,
        default=None,
        help="replica i also listens on this port + i, for /metrics and probes (default: --port + 1)",
    )
    replicas.add_argument(
        "--ray-address",
        default=None,
        help="the Ray cluster to join (default: RAY_ADDRESS, else a new local one)",
    )
    add_engine_arguments(parser)
    add_telemetry_arguments(parser)
    parser.set_defaults(run=run)


def server_options_from_args(args) -> ServerOptions:
    """The `ServerOptions` the parsed ``serve`` options describe."""
    return ServerOptions(
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        metrics_require_key=args.metrics_require_key,
        max_body_bytes=parse_bytes(args.max_body_bytes),
        max_queued_requests=args.max_queued_requests,
        shutdown_timeout=args.shutdown_timeout,
        served_model_name=args.served_model_name,
        allowed_origins=[
            origin.strip() for origin in args.allowed_origins.split(",") if origin.strip()
        ],
        engine_process=args.engine_process,
        allow_runtime_lora=args.allow_runtime_lora,
        reasoning_parser=args.reasoning_parser,
        tool_call_parser=args.tool_call_parser,
        allowed_media_domains=[
            host.strip() for host in args.allowed_media_domains.split(",") if host.strip()
        ],
        media_fetch_timeout=args.media_fetch_timeout,
        max_media_bytes=parse_bytes(args.max_media_bytes),
        trust_request_chat_template=args.trust_request_chat_template,
        responses_store_size=args.responses_store_size,
        chat_completions_store_size=_unless_replicated(args, "chat_completions_store_size"),
        conversations_store_size=args.conversations_store_size,
        batches_store_size=_unless_replicated(args, "batches_store_size"),
    )


def _unless_replicated(args, name: str) -> int:
    """A store size option's value, or its default: none behind the replica router, where each
    replica would keep its own, a list could show one replica's only and a batch could miss its
    file (`REPLICATED_STORES`)."""
    given = getattr(args, name)
    if given is not None:
        return given
    return 0 if args.replicas else getattr(ServerOptions(), name)


REPLICATED_STORES = ("chat_completions_store_size", "batches_store_size")
"""The stores no replica keeps: their options are refused with ``--replicas``."""


def run(args) -> int:
    """Build the app and serve it until a signal arrives."""
    if args.model_positional:
        args.model = args.model_positional
    options = server_options_from_args(args)
    if args.replicas and options.engine_process:
        print(
            "spyglass serve: --engine-process and --replicas do not combine (each replica is a "
            "process of its own already)",
            file=sys.stderr,
        )
        return 2
    for name in REPLICATED_STORES if args.replicas else ():
        if getattr(options, name):
            flag = "--" + name.replace("_", "-")
            print(
                f"spyglass serve: {flag} does not combine with --replicas (each replica would "
                "keep its own: a list could show one replica's only)",
                file=sys.stderr,
            )
            return 2
    if args.replicas and options.allow_runtime_lora:
        print(
            "spyglass serve: --allow-runtime-lora does not combine with --replicas (a load would "
            "reach one replica; give the adapters to all of them with --lora-modules)",
            file=sys.stderr,
        )
        return 2
    loading = engine_config = None
    if not args.replicas:
        telemetry = settings_from_args(args)
        telemetry_settings.configure(telemetry)  # the process default: /metrics naming, tracing
        engine_config = engine_config_from_args(args, telemetry=telemetry, seed=args.seed)
        from spyglass.core.api import engine_placement

        if engine_placement.in_own_process(options, engine_config):
            # Spawned first: the engine process imports and loads while this one imports the server.
            loading = engine_placement.start_engine_process(engine_config)
    # The HTTP stack, the engine and Ray load here, not at import, so ``spyglass serve --help`` is quick.
    with collector_paused():
        from spyglass.core.cli.server import serve
        from spyglass.core.loaders.hf_loader import check_supported

    try:
        # Before the server starts: an unsupported architecture is a one-line answer, not a start-up traceback.
        if args.model:
            check_supported(args.model)
    except ValueError as error:
        if loading is not None:
            loading.cancel()
        print(f"spyglass serve: {error}", file=sys.stderr)
        return 2
    if args.replicas:
        from spyglass.core.cli.replicas import serve_replicas

        return serve_replicas(args, options)
    return serve(args, options, engine_config, loading)
