"""What handlers share: the server's options, the running engine, and the checks done before any work."""

import asyncio
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager

from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler

from spyglass.core.api.background_responses import BackgroundResponses
from spyglass.core.api.batch_records import BatchRun, StoredFile
from spyglass.core.api.chat_store import StoredChatCompletion
from spyglass.core.api.conversation_store import Conversation
from spyglass.core.api.errors import APIError
from spyglass.core.api.fill_in_middle import fim_tokens
from spyglass.core.api.kept_store import KeptStore
from spyglass.core.api.response_store import StoredResponse
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.api.tools import ToolFormat
from spyglass.core.engine.engine_client import EngineClient
from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.snapshot import EngineSnapshot
from spyglass.telemetry import metrics


class ServingContext:
    """The running engine and what the API knows about it; lives on ``app.state.serving``."""

    def __init__(
        self, async_engine: EngineClient, options: ServerOptions, model_path: str | None = None
    ):
        model = async_engine.model
        self.async_engine = async_engine
        self.options = options
        self.tokenizer = async_engine.tokenizer
        self.responses: KeptStore[StoredResponse] = KeptStore(
            "response", options.responses_store_size, metrics.RESPONSES_KEPT
        )
        """The Responses API's kept responses (``previous_response_id``, ``GET /v1/responses/{id}``)."""
        self.fim = fim_tokens(self.tokenizer)
        """The model's fill-in-the-middle tokens (completions' ``suffix``); None without them."""
        self.conversations: KeptStore[Conversation] = KeptStore(
            "conversation", options.conversations_store_size, metrics.CONVERSATIONS_KEPT, touch=True
        )
        """OpenAI's conversations (``POST /v1/conversations``; a Responses call's ``conversation``)."""
        self.chat_completions: KeptStore[StoredChatCompletion] = KeptStore(
            "chat completion", options.chat_completions_store_size, metrics.CHAT_COMPLETIONS_KEPT
        )
        """OpenAI's stored chat completions (``store: true``; ``GET /v1/chat/completions/{id}``)."""
        self.files: KeptStore[StoredFile] = KeptStore(
            "file", options.batches_store_size, metrics.FILES_KEPT
        )
        """OpenAI's files: batch inputs, and the output and error files batches write."""
        self.batches: KeptStore[BatchRun] = KeptStore("batch", options.batches_store_size)
        """OpenAI's batches (``POST /v1/batches``), running or ended."""
        self.running_batches: set[BatchRun] = set()
        """The batches being answered, kept or not: a stopping server cancels them."""
        self.background = BackgroundResponses()
        """The Responses API's calls being answered in the background (``background: true``)."""
        self.model_name = options.served_model_name or model.model_name
        self.model_aliases = {self.model_name, model.model_name} | (
            {model_path} if model_path else set()
        )
        self.lora_enabled = model.lora_enabled
        self.loras: dict[str, LoRAInfo] = {info.name: info for info in model.loras}
        """The LoRA adapters requests may name as their ``model`` (loaded at start or at run time)."""
        self.max_model_len = model.max_model_len
        self.vocab_size = model.vocab_size
        self.labels = model.labels
        self.vision = model.vision
        """A vision model's image token and preprocessing; None when the model reads no images."""
        self.max_images_per_prompt = model.max_images_per_prompt
        self.max_videos_per_prompt = model.max_videos_per_prompt
        self.video_sampling = model.video_sampling
        self.sampling_defaults = model.sampling_defaults
        """Sampling settings for requests that leave them out (``--generation-config``)."""
        self.orders_by_priority = model.orders_by_priority
        """Whether the scheduling policy orders requests by priority (``service_tier``)."""
        # No text longer than this can fit the context: each token covers at most the longest token's bytes.
        self.max_prompt_bytes = model.max_model_len * _longest_token_bytes(self.tokenizer)
        # Splits text into content and tool calls for chat requests that leave the choice to the
        # model (``--tool-call-parser``). The default's absence (its plugin disabled) leaves answers
        # whole; a format the operator named must exist.
        self.tool_parser = async_engine.tool_call_parser(options.tool_call_parser)
        if self.tool_parser is None and options.tool_call_parser != ServerOptions.tool_call_parser:
            raise ValueError(
                f"no plugin provides the tool-call parser {options.tool_call_parser!r} "
                "(--tool-call-parser; built in: hermes, llama3_json, mistral, qwen3_coder, pythonic, "
                "phi4_mini_json)"
            )
        self.tool_format = ToolFormat(options.tool_call_parser, self.tool_parser)
        # Splits answers into the model's reasoning and its content (``--reasoning-parser``).
        self.reasoning_parser = None
        if options.reasoning_parser is not None:
            self.reasoning_parser = async_engine.reasoning_parser(options.reasoning_parser)
            if self.reasoning_parser is None:
                raise ValueError(
                    f"no plugin provides the reasoning parser {options.reasoning_parser!r} "
                    "(--reasoning-parser; built in: deepseek_r1, qwen3, mistral)"
                )
        self.created = int(time.time())
        self.draining = False
        self.num_queued = 0

    def check_model(self, model: str | None) -> str | None:
        """The LoRA adapter ``model`` names (None for the base model); a 404 unless ``model`` is
        omitted or names the served model or a loaded adapter."""
        if model is None or model in self.model_aliases:
            return None
        if model in self.loras:
            return model
        adapters = "".join(f", `{name}`" for name in self.loras)
        raise APIError(
            404,
            f"The model `{model}` does not exist; this server serves `{self.model_name}`{adapters}.",
            "model",
            "model_not_found",
        )

    def response_model(self, model: str | None) -> str:
        """The ``model`` a response names: the adapter the request ran with, else the served model."""
        return model if model in self.loras else self.model_name

    def admit(self) -> None:
        """Refuse new work while shutting down or after the engine stopped (503)."""
        if self.draining or not self.async_engine.is_alive:
            raise APIError(
                503,
                "the server is shutting down or its engine has stopped",
                code="engine_unavailable",
            )

    @contextmanager
    def queue_slots(self, num_requests: int, param: str = "n") -> Iterator[None]:
        """Hold ``num_requests`` places of the queue (until the call's requests have started); 429 when full.

        Every engine request counts, so one call with many prompts or a large ``n`` weighs what it
        costs; a call that makes more than the queue holds is a 400 naming ``param``.
        """
        limit = self.options.max_queued_requests
        if num_requests > limit:
            raise APIError(
                400,
                f"this call makes {num_requests} engine requests (prompts x n); the limit is {limit}",
                param,
            )
        queued = max(self.num_queued, self.async_engine.latest.num_waiting)
        if queued + num_requests > limit:
            raise APIError(
                429,
                f"too many queued requests ({queued} of {limit}); retry later",
                code="queue_full",
                headers={"Retry-After": "1"},
            )
        self.num_queued += num_requests
        try:
            yield
        finally:
            self.num_queued -= num_requests

    async def snapshot(self, with_requests: bool = False, timeout: float = 10.0) -> EngineSnapshot:
        """A snapshot taken in the engine thread between steps; 503 if the loop is gone or does not answer."""
        if not self.async_engine.is_alive:
            raise APIError(503, "the engine is not running", code="engine_unavailable")
        try:
            return await asyncio.wait_for(self.async_engine.snapshot(with_requests), timeout)
        except TimeoutError:
            raise APIError(
                503, "the engine did not answer in time", code="engine_unavailable"
            ) from None


def _longest_token_bytes(tokenizer) -> int:
    return max(len(token.encode()) for token in tokenizer.backend.get_vocab(with_added_tokens=True))


def provide_serving(state: State) -> ServingContext:
    """Dependency: the `ServingContext` the lifespan put on the app state."""
    return state.serving


def api_key_guard(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """Demand ``Authorization: Bearer <key>`` when a key is set, except on handlers marked public.

    Handlers opt out with ``opt={"public": True}``; ``opt={"metrics": True}`` is public unless
    ``--metrics-require-key`` was given.
    """
    serving: ServingContext | None = getattr(connection.app.state, "serving", None)
    key = serving.options.api_key if serving else None
    if serving is None or key is None or handler.opt.get("public"):
        return
    if handler.opt.get("metrics") and not serving.options.metrics_require_key:
        return
    scheme, _, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        token.strip().encode(), key.encode()
    ):
        raise APIError(
            401,
            "missing or invalid API key; send `Authorization: Bearer <key>`",
            code="invalid_api_key",
        )
