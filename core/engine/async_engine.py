"""The engine loop in a background thread, and the asyncio front the HTTP API talks to.

The loop thread owns the `LLMEngine`; the front only sends commands (add, abort) through a
queue, receives `RequestOutput` objects through per-request asyncio queues, and reads the
engine's state as immutable snapshots (`snapshot`). The HTTP API reaches the engine through this
front only (an import-linter contract in pyproject.toml checks it).
"""

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.snapshot import EngineSnapshot, ModelDescription
from spyglass.core.engine.tool_calls import ToolCallParser
from spyglass.core.tokenizer import Tokenizer

log = logging.getLogger("spyglass.engine")


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served."""


class AsyncEngine:
    """Runs `LLMEngine.step` in a loop thread while asyncio tasks submit requests and stream outputs."""

    def __init__(self, engine: LLMEngine, on_crash: Callable[[BaseException], None] | None = None):
        """``on_crash`` is called (in the loop thread) if the loop itself fails; the server exits on it."""
        self._engine = engine
        self.model: ModelDescription = engine.describe()
        self.tokenizer: Tokenizer = engine.tokenizer
        self.latest: EngineSnapshot = engine.snapshot()
        """The snapshot taken after the loop's last step; refreshed every iteration of the loop."""
        self._on_crash = on_crash
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._thread = threading.Thread(target=self._run, name="spyglass-engine", daemon=True)
        self._drain_timeout = 0.0

    @classmethod
    def load(
        cls, config: EngineConfig, on_crash: Callable[[BaseException], None] | None = None
    ) -> "AsyncEngine":
        """Load an engine for ``config`` (blocking: seconds to minutes) and put a front on it; not yet started."""
        return cls(LLMEngine(config), on_crash)

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    @property
    def is_running(self) -> bool:
        """True while the loop thread runs, draining after `stop` included."""
        return self._thread.is_alive()

    @property
    def is_alive(self) -> bool:
        """True while the loop thread runs and has not been asked to stop."""
        return self._thread.is_alive() and not self._stopping.is_set()

    def stop(self, timeout: float = 30.0) -> None:
        """Let running requests finish for up to ``timeout`` seconds, abort the rest and stop the loop."""
        self._submit(lambda: None)
        self._drain_timeout = timeout
        self._stopping.set()
        self._wakeup.set()
        self._thread.join(timeout + 10)

    async def generate(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        attributes: dict | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue a request and yield its outputs until it finishes; aborts it if the caller stops listening.

        Raises `InvalidRequestError` (before yielding) for a request the engine rejects.
        """
        if not self.is_alive:
            raise EngineDeadError("the engine is not running")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[req_id] = (asyncio.get_running_loop(), stream)
        added: Future = Future()

        def add() -> None:
            _settle(
                added,
                lambda: self._engine.add_request(
                    req_id, prompt_token_ids, params, prompt, attributes
                ),
            )

        finished = False
        try:
            self._submit(add)
            await asyncio.wrap_future(added)
            while not finished:
                output = await stream.get()
                # Outputs are cumulative: when the listener fell behind, the newest one says it all
                # (one chunk with several tokens instead of one per token, the listener catches up).
                while not isinstance(output, Exception) and not stream.empty():
                    output = stream.get_nowait()
                if isinstance(output, Exception):
                    raise output
                finished = output.finished
                yield output
        finally:
            self._streams.pop(req_id, None)
            if not finished:
                self.abort(req_id)

    def abort(self, req_id: str) -> None:
        """Ask the loop to abort a request (no-op if it already ended)."""
        self._submit(lambda: self._engine.abort(req_id))

    async def snapshot(self, with_requests: bool = False) -> EngineSnapshot:
        """A fresh snapshot, taken in the loop thread between steps (`LLMEngine.snapshot`)."""
        return await asyncio.wrap_future(self.call(lambda engine: engine.snapshot(with_requests)))

    def tool_call_parser(self, name: str) -> ToolCallParser | None:
        """The tool-call parser a plugin provides under ``name`` (`spyglass_tool_call_parser`), if any."""
        return self._engine.hooks.spyglass_tool_call_parser(name=name)

    def call(self, function: Callable[[LLMEngine], object]) -> Future:
        """Run ``function(engine)`` in the loop thread between steps (tests and tools; the API uses snapshots)."""
        result: Future = Future()

        self._submit(lambda: _settle(result, lambda: function(self._engine)))
        return result

    def _submit(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._run_commands()
                if self._engine.has_unfinished_requests:
                    self._deliver(self._engine.step())
                else:
                    self._wakeup.wait(0.5)
                    self._wakeup.clear()
                self.latest = self._engine.snapshot()
            self._drain()
        except Exception as error:
            log.exception("engine loop crashed")
            self._stopping.set()
            if self._on_crash is not None:
                self._on_crash(error)
            self._fail_all(EngineDeadError(f"engine loop crashed: {error}"))
        finally:
            self._stopping.set()
            self._engine.shutdown()

    def _drain(self) -> None:
        """After stop: run commands, let requests finish until the deadline, then abort what is left."""
        deadline = time.monotonic() + self._drain_timeout
        while self._engine.has_unfinished_requests and time.monotonic() < deadline:
            self._run_commands()
            self._deliver(self._engine.step())
        self._deliver(self._engine.abort_all())

    def _run_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                command()
            # a command answers through its own future; none may take the loop down
            except Exception:
                log.exception("engine command failed")

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand a step's outputs to their listeners: one wake-up per event loop, not one per output."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}
        for output in outputs:
            target = self._streams.get(output.request_id)
            if target is not None:
                batches.setdefault(target[0], []).append((target[1], output))
        for loop, items in batches.items():
            _put(loop, items)

    def _fail_all(self, error: Exception) -> None:
        for loop, stream in list(self._streams.values()):
            _put(loop, [(stream, error)])


def _put(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue, object]]) -> None:
    """Put each item in its queue, in ``loop``'s thread; a loop that has closed has no listener left."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[asyncio.Queue, object]]) -> None:
    for stream, item in items:
        stream.put_nowait(item)


def _settle(future: Future, function: Callable[[], object]) -> None:
    """Resolve ``future`` with ``function()`` or its exception, unless its caller gave up on it already."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(function())
    except Exception as error:
        future.set_exception(error)
