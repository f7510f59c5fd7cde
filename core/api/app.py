"""The Litestar app: its lifespan owns the engine; handlers reach it through dependency injection."""

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.config.cors import CORSConfig
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

import spyglass
from spyglass.core.api.batches import (
    cancel_batch,
    close_batches,
    create_batch,
    list_batches,
    retrieve_batch,
)
from spyglass.core.api.chat import create_chat_completion
from spyglass.core.api.classification import create_classification
from spyglass.core.api.completions import create_completion
from spyglass.core.api.context import ServingContext, api_key_guard, provide_serving
from spyglass.core.api.conversations import (
    create_conversation,
    create_conversation_items,
    delete_conversation,
    delete_conversation_item,
    list_conversation_items,
    retrieve_conversation,
    retrieve_conversation_item,
    update_conversation,
)
from spyglass.core.api.embeddings import create_embedding
from spyglass.core.api.engine_placement import load_engine
from spyglass.core.api.errors import EXCEPTION_HANDLERS
from spyglass.core.api.files import (
    create_file,
    delete_file,
    list_files,
    retrieve_file,
    retrieve_file_content,
)
from spyglass.core.api.lora_routes import load_lora_adapter, unload_lora_adapter
from spyglass.core.api.messages import count_message_tokens, create_message
from spyglass.core.api.openapi_structs import ClosedStructSchemaPlugin
from spyglass.core.api.response_input_tokens import count_input_tokens
from spyglass.core.api.responses import create_response
from spyglass.core.api.routes import ROUTES
from spyglass.core.api.scoring import create_rerank, create_score
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.api.stored_chat_completions import (
    delete_chat_completion,
    list_chat_completion_messages,
    list_chat_completions,
    retrieve_chat_completion,
    update_chat_completion,
)
from spyglass.core.api.stored_responses import (
    cancel_response,
    delete_response,
    list_input_items,
    retrieve_response,
)
from spyglass.core.api.tokenize import detokenize, tokenize
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine_process import LoadingEngineProcess
from spyglass.telemetry import metrics
from spyglass.telemetry.http import remember_exception

log = logging.getLogger("spyglass.api")


def create_app(
    engine_config: EngineConfig,
    server_options: ServerOptions | None = None,
    on_engine_crash: Callable[[BaseException], None] | None = None,
    loading: LoadingEngineProcess | None = None,
) -> Litestar:
    """An app that loads the engine on start-up, serves the OpenAI API, and stops the engine on shutdown.

    ``on_engine_crash`` is called if the engine loop itself fails: the server must then exit
    (non-zero, for a supervisor to restart it) rather than answer 503 for ever. ``loading`` is an
    engine process spawned already (`engine_placement.start_engine_process`), to wait for.
    """
    options = server_options or ServerOptions()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        start = time.perf_counter()
        async_engine = await asyncio.to_thread(
            load_engine, engine_config, options, on_engine_crash, loading
        )
        async_engine.start()
        try:
            app.state.serving = ServingContext(async_engine, options, engine_config.model)
        except ValueError:  # an option the engine's plugins cannot meet (--reasoning-parser)
            await asyncio.to_thread(async_engine.stop, 0)
            raise
        reasoning = options.reasoning_parser or "none"
        metrics.SERVER_CONFIG_INFO.labels(
            async_engine.placement, options.tool_call_parser, reasoning
        ).set(1)
        log.info(
            "Serving %s on http://%s:%d (engine in a %s, loaded in %.1f s; tool calls read as %s, "
            "reasoning as %s; OpenAPI at /schema)",
            app.state.serving.model_name,
            options.host,
            options.port,
            async_engine.placement,
            time.perf_counter() - start,
            options.tool_call_parser,
            reasoning,
        )
        try:
            yield
        finally:
            await close_batches(app.state.serving)  # a batch may run for hours: it stops now
            await asyncio.to_thread(async_engine.stop, options.shutdown_timeout)
            await app.state.serving.background.close()  # what the engine could not finish
            log.info("engine stopped")

    return Litestar(
        route_handlers=[
            create_completion,
            create_chat_completion,
            list_chat_completions,
            retrieve_chat_completion,
            list_chat_completion_messages,
            update_chat_completion,
            delete_chat_completion,
            create_response,
            count_input_tokens,
            retrieve_response,
            list_input_items,
            cancel_response,
            delete_response,
            create_file,
            list_files,
            retrieve_file,
            retrieve_file_content,
            delete_file,
            create_batch,
            list_batches,
            retrieve_batch,
            cancel_batch,
            create_conversation,
            retrieve_conversation,
            update_conversation,
            delete_conversation,
            create_conversation_items,
            list_conversation_items,
            retrieve_conversation_item,
            delete_conversation_item,
            create_embedding,
            create_score,
            create_rerank,
            create_classification,
            create_message,
            count_message_tokens,
            tokenize,
            detokenize,
            load_lora_adapter,
            unload_lora_adapter,
            *ROUTES,
        ],
        dependencies={"serving": Provide(provide_serving, sync_to_thread=False)},
        guards=[api_key_guard],
        exception_handlers=EXCEPTION_HANDLERS,
        after_exception=[remember_exception],  # a 5xx's span records its exception
        lifespan=[lifespan],
        request_max_body_size=options.max_body_bytes,
        cors_config=CORSConfig(allow_origins=options.allowed_origins)
        if options.allowed_origins
        else None,
        openapi_config=OpenAPIConfig(title="Spyglass", version=spyglass.__version__),
        plugins=[ClosedStructSchemaPlugin()],
        debug=False,
        logging_config=None,  # keep the handler `setup_logging` installed (Litestar's would replace it)
    )


def begin_shutdown(app: Litestar, timeout: float) -> threading.Thread | None:
    """Stop admitting requests (503) and let the engine finish or abort in-flight ones within ``timeout``.

    Returns at once with the thread the engine drains in (None if there is no engine or it already
    drains), while the HTTP server keeps listening and lets open responses complete.
    """
    serving: ServingContext | None = getattr(app.state, "serving", None)
    if serving is None or serving.draining:
        return None
    serving.draining = True
    log.info("shutting down: finishing in-flight requests for up to %.0f s", timeout)
    thread = threading.Thread(
        target=serving.async_engine.stop, args=(timeout,), name="spyglass-drain", daemon=True
    )
    thread.start()
    return thread
