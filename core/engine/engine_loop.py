"""The thread that owns an `LLMEngine`: it steps while there is work and runs commands between steps.

Both fronts run one: `AsyncEngine` in the server's own process, and the engine process behind
`EngineProcess`. Whoever starts it sends commands (`submit`, `call`) and gets each iteration's
outputs and a fresh snapshot through ``on_step``, in the loop thread.
"""

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.snapshot import EngineSnapshot

if TYPE_CHECKING:  # a name only: the server side of an engine process never imports the engine
    from spyglass.core.engine.engine import LLMEngine

log = logging.getLogger("spyglass.engine")


class EngineDeadError(RuntimeError):
    """The engine loop has stopped; no request can be served."""


StepListener = Callable[[list[RequestOutput], EngineSnapshot], None]


class EngineLoop:
    """Runs `LLMEngine.step` in a thread while requests are unfinished; commands run between steps."""

    def __init__(
        self,
        engine: "LLMEngine",
        on_step: StepListener,
        on_crash: Callable[[BaseException], None] | None = None,
    ):
        """``on_step(outputs, snapshot)`` follows every iteration (outputs may be empty when idle).

        ``on_crash`` is called, in the loop thread, if the loop itself fails.
        """
        self.engine = engine
        self.latest: EngineSnapshot = engine.snapshot()
        """The snapshot taken after the loop's last iteration."""
        self._on_step = on_step
        self._on_crash = on_crash
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spyglass-engine", daemon=True)
        self._drain_timeout = 0.0

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
        self.submit(lambda: None)
        self._drain_timeout = timeout
        self._stopping.set()
        self._wakeup.set()
        self._thread.join(timeout + 10)

    def submit(self, command: Callable[[], None]) -> None:
        """Run ``command()`` in the loop thread before its next step (it must not raise: it is logged)."""
        self._commands.put(command)
        self._wakeup.set()

    def call(self, function: Callable[["LLMEngine"], object]) -> Future:
        """``function(engine)`` run in the loop thread between steps; its result or exception."""
        result: Future = Future()
        self.submit(lambda: settle(result, lambda: function(self.engine)))
        return result

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._run_commands()
                if self.engine.has_unfinished_requests:
                    outputs = self.engine.step()
                else:
                    outputs = []
                    self._wakeup.wait(0.5)
                    self._wakeup.clear()
                self._announce(outputs)
            self._drain()
        except Exception as error:
            log.exception("engine loop crashed")
            self._stopping.set()
            if self._on_crash is not None:
                self._on_crash(error)
        finally:
            self._stopping.set()
            self.engine.shutdown()

    def _announce(self, outputs: list[RequestOutput]) -> None:
        self.latest = self.engine.snapshot()
        self._on_step(outputs, self.latest)

    def _drain(self) -> None:
        """After stop: run commands, let requests finish until the deadline, then abort what is left."""
        deadline = time.monotonic() + self._drain_timeout
        while self.engine.has_unfinished_requests and time.monotonic() < deadline:
            self._run_commands()
            self._announce(self.engine.step())
        self._run_commands()
        self._announce(self.engine.abort_all())

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


def settle(future: Future, function: Callable[[], object]) -> None:
    """Resolve ``future`` with ``function()`` or its exception, unless its caller gave up on it already."""
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(function())
    except Exception as error:
        future.set_exception(error)
