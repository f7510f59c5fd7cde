"""The engine loop in a background thread, and the asyncio front the HTTP API talks to.

The loop thread (`EngineLoop`) owns the `LLMEngine`; the front only sends commands (add, abort)
to it, receives `RequestOutput` objects through per-request asyncio queues (`OutputStreams`), and
reads the engine's state as immutable snapshots (`snapshot`). The HTTP API reaches the engine
through a front only (an import-linter contract in pyproject.toml checks it): this one, or
`EngineProcess` with the engine in a process of its own; both follow `EngineClient`.
"""

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.engine_loop import EngineDeadError, EngineLoop, settle
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.output_streams import OutputStreams
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.reasoning import ReasoningParser
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.snapshot import EngineSnapshot, ModelDescription
from spyglass.core.engine.tool_calls import ToolCallParser
from spyglass.core.tokenizer import Tokenizer


class AsyncEngine:
    """Runs `LLMEngine.step` in a loop thread while asyncio tasks submit requests and stream outputs."""

    placement = "thread"

    def __init__(self, engine: LLMEngine, on_crash: Callable[[BaseException], None] | None = None):
        """``on_crash`` is called (in the loop thread) if the loop itself fails; the server exits on it."""
        self.model: ModelDescription = engine.describe()
        self.tokenizer: Tokenizer = engine.tokenizer
        self._on_crash = on_crash
        self._streams = OutputStreams()
        self._loop = EngineLoop(
            engine, lambda outputs, _: self._streams.deliver(outputs), self._crashed
        )

    @classmethod
    def load(
        cls, config: EngineConfig, on_crash: Callable[[BaseException], None] | None = None
    ) -> "AsyncEngine":
        """Load an engine for ``config`` (blocking: seconds to minutes) and put a front on it; not yet started."""
        return cls(LLMEngine(config), on_crash)

    def start(self) -> None:
        """Start the loop thread."""
        self._loop.start()

    @property
    def latest(self) -> EngineSnapshot:
        """The snapshot taken after the loop's last iteration."""
        return self._loop.latest

    @property
    def is_running(self) -> bool:
        """True while the loop thread runs, draining after `stop` included."""
        return self._loop.is_running

    @property
    def is_alive(self) -> bool:
        """True while the loop thread runs and has not been asked to stop."""
        return self._loop.is_alive

    def stop(self, timeout: float = 30.0) -> None:
        """Let running requests finish for up to ``timeout`` seconds, abort the rest and stop the loop."""
        self._loop.stop(timeout)

    def generate(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        attributes: dict | None = None,
        lora_name: str | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs until it finishes; aborts it if the caller stops listening.

        Raises `InvalidRequestError` (before yielding) for a request the engine rejects.
        """

        def add() -> Future:
            if not self.is_alive:
                raise EngineDeadError("the engine is not running")
            added: Future = Future()
            self._loop.submit(
                lambda: settle(
                    added,
                    lambda: self._loop.engine.add_request(
                        req_id, prompt_token_ids, params, prompt, attributes, lora_name, images
                    ),
                )
            )
            return added

        return self._streams.listen(req_id, add, self.abort, params.output_kind)

    def abort(self, req_id: str) -> None:
        """Ask the loop to abort a request (no-op if it already ended)."""
        self._loop.submit(lambda: self._loop.engine.abort(req_id))

    async def snapshot(self, with_requests: bool = False) -> EngineSnapshot:
        """A fresh snapshot, taken in the loop thread between steps (`LLMEngine.snapshot`)."""
        return await asyncio.wrap_future(self.call(lambda engine: engine.snapshot(with_requests)))

    async def load_lora(self, name: str, path: str) -> LoRAInfo:
        """Load a PEFT adapter under ``name`` in the loop thread, between steps."""
        return await asyncio.wrap_future(self.call(lambda engine: engine.add_lora(name, path)))

    async def unload_lora(self, name: str) -> None:
        """Unload an adapter in the loop thread, between steps."""
        await asyncio.wrap_future(self.call(lambda engine: engine.remove_lora(name)))

    def tool_call_parser(self, name: str) -> ToolCallParser | None:
        """The tool-call parser a plugin provides under ``name`` (`spyglass_tool_call_parser`), if any."""
        return self._loop.engine.hooks.spyglass_tool_call_parser(name=name)

    def reasoning_parser(self, name: str) -> ReasoningParser | None:
        """The reasoning parser a plugin provides under ``name`` (`spyglass_reasoning_parser`), if any."""
        return self._loop.engine.hooks.spyglass_reasoning_parser(name=name)

    async def metric_families(self, collect: Callable[[], list]) -> list | None:
        """None: the engine records its metrics in this process's own registry (``collect`` is not needed)."""
        return None

    def call(self, function: Callable[[LLMEngine], object]) -> Future:
        """Run ``function(engine)`` in the loop thread between steps (tests and tools; the API uses snapshots)."""
        return self._loop.call(function)

    def _crashed(self, error: BaseException) -> None:
        if self._on_crash is not None:
            self._on_crash(error)
        self._streams.fail_all(EngineDeadError(f"engine loop crashed: {error}"))
