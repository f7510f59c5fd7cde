"""Where ``spyglass serve`` runs its engine: in a thread of the server's, or in a process of its own.

Importable without the HTTP stack or the engine, so that the CLI can spawn the engine process
before the server imports them: the two processes then import and load side by side.
"""

import functools
from collections.abc import Callable

from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine_client import EngineClient
from spyglass.core.engine.engine_process import LoadingEngineProcess
from spyglass.core.engine.engine_process_child import ProcessSetup
from spyglass.telemetry import process_bridge
from spyglass.telemetry import settings as telemetry_settings


def start_engine_process(engine_config: EngineConfig) -> LoadingEngineProcess:
    """Spawn the engine process with the telemetry bridge across its boundary; it loads meanwhile."""
    setup = ProcessSetup(
        prepare=functools.partial(
            process_bridge.prepare_engine_process,
            telemetry_settings.resolve(engine_config.telemetry),
        ),
        export_attributes=process_bridge.export_attributes,
        import_attributes=process_bridge.import_attributes,
        take_feedback=process_bridge.drain_span_changes,
        apply_feedback=process_bridge.apply_span_changes,
        abandoned=process_bridge.mark_abandoned,
    )
    return LoadingEngineProcess(engine_config, setup)


def in_own_process(options: ServerOptions, engine_config: EngineConfig) -> bool:
    """Whether the engine gets a process of its own: as ``options.engine_process`` says, else when
    it runs on CUDA. There the engine's host work is one busy thread that the server's JSON, SSE and
    event loop would otherwise take the interpreter lock from: on an H200, served W3 went from 56%
    of offline in a thread to 87% in a process (the README's GPU section). On the CPU the engine's
    matmul threads take every core either way, and the thread spares a process."""
    if options.engine_process is not None:
        return options.engine_process
    return engine_config.torch_device().type == "cuda"


def load_engine(
    engine_config: EngineConfig,
    options: ServerOptions,
    on_crash: Callable[[BaseException], None] | None,
    loading: LoadingEngineProcess | None = None,
) -> EngineClient:
    """The engine behind the API (blocking until loaded): ``loading`` if it was spawned already,
    else a process of its own (`in_own_process`) or a thread of this process."""
    if loading is None and in_own_process(options, engine_config):
        loading = start_engine_process(engine_config)
    if loading is not None:
        return loading.wait(on_crash)
    from spyglass.core.engine.async_engine import AsyncEngine  # the engine, in this process

    return AsyncEngine.load(engine_config, on_crash)
