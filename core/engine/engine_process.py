"""The engine in a process of its own, behind the same front as `AsyncEngine` (``--engine-process``).

In one process the engine's loop thread and the HTTP event loop share one interpreter lock: when
steps are short (a GPU), the server's per-token work (JSON, SSE, the event loop) slows the engine.
Here the engine, its plugins and its telemetry run in a child process (spawned, never forked),
like vLLM's engine core: the server sends commands through one pipe, and a reader thread turns
the child's messages (`engine_process_child`) into outputs for the waiting requests. Outputs
travel as plain tuples (`output_wire`) without their prompt (the server puts back the one it
sent), so a step's message costs what its outputs hold: a few tokens each for delta outputs
(`RequestOutputKind.DELTA`, what the HTTP API asks for). The child's Prometheus samples are
fetched at scrape time (`metric_families`).
"""

import asyncio
import atexit
import functools
import itertools
import logging
import multiprocessing
import operator
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine_loop import EngineDeadError
from spyglass.core.engine.engine_process_child import (
    ProcessSetup,
    add_lora,
    reasoning_parser,
    remove_lora,
    run_engine_process,
    tool_call_parser,
)
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.output_streams import OutputStreams
from spyglass.core.engine.output_wire import WireOutput, from_wire
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.reasoning import ReasoningParser
from spyglass.core.engine.request_intake import truncated_prompt
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.snapshot import EngineSnapshot, ModelDescription
from spyglass.core.engine.tool_calls import ToolCallParser
from spyglass.core.tokenizer import Tokenizer

log = logging.getLogger("spyglass.engine")


class LoadingEngineProcess:
    """An engine process spawned and loading: the server imports and sets up meanwhile, then `wait`s."""

    def __init__(self, config: EngineConfig, setup: ProcessSetup | None = None):
        self._setup = setup or ProcessSetup()
        context = multiprocessing.get_context("spawn")
        command_reader, self._commands = context.Pipe(duplex=False)
        self._events, event_writer = context.Pipe(duplex=False)
        self._process = context.Process(
            target=run_engine_process,
            args=(config, self._setup, command_reader, event_writer),
            name="spyglass-engine",
        )
        self._process.start()
        command_reader.close()
        event_writer.close()
        self._stopping = threading.Event()
        """Set by `EngineProcess.stop`, or at exit: the end of the process is then no crash."""
        atexit.register(self._close_at_exit)

    def _close_at_exit(self) -> None:
        """Exiting without `stop` (an error on the way): the closed pipe tells the engine process to
        stop, before multiprocessing waits for it at exit."""
        self._stopping.set()
        self._commands.close()

    def wait(self, on_crash: Callable[[BaseException], None] | None = None) -> "EngineProcess":
        """The front, once the engine has loaded; raises what loading raised."""
        try:
            ready = self._events.recv()
        except EOFError:
            self._process.join()
            raise RuntimeError(
                f"the engine process exited with code {self._process.exitcode} while loading"
            ) from None
        if ready[0] == "failed":
            self._process.join()
            raise ready[1]
        log.info("engine process %d is ready", self._process.pid)
        return EngineProcess(
            self._process,
            self._commands,
            self._events,
            ready,
            self._setup,
            on_crash,
            self._stopping,
        )

    def cancel(self) -> None:
        """Stop the process before it is used (the server will not start after all)."""
        self._commands.close()
        self._process.kill()
        self._process.join()


class EngineProcess:
    """A front whose engine runs in a child process; see `AsyncEngine` for the methods' contracts."""

    placement = "process"

    def __init__(
        self,
        process: multiprocessing.process.BaseProcess,
        commands: Connection,
        events: Connection,
        ready: tuple,
        setup: ProcessSetup,
        on_crash: Callable[[BaseException], None] | None,
        stopping: threading.Event,
    ):
        _, self.model, self.tokenizer = ready
        self.model: ModelDescription
        self.tokenizer: Tokenizer
        self.latest: EngineSnapshot = EngineSnapshot(0, 0, 0, 0, 0)
        """The snapshot the engine process sent after its last iteration that changed it."""
        self._process = process
        self._commands = commands
        self._events = events
        self._setup = setup
        self._on_crash = on_crash
        self._send_lock = threading.Lock()
        self._streams = OutputStreams()
        self._added: dict[str, Future] = {}
        self._prompts: dict[str, tuple[str | None, list[int]]] = {}
        """The prompt of each request that has not had its finished output, put back on its outputs."""
        self._calls: dict[int, Future] = {}
        self._call_ids = itertools.count()
        self._stopping = stopping
        self._ended = threading.Event()
        self._reader = threading.Thread(
            target=self._read, name="spyglass-engine-reader", daemon=True
        )

    @classmethod
    def load(
        cls,
        config: EngineConfig,
        on_crash: Callable[[BaseException], None] | None = None,
        setup: ProcessSetup | None = None,
    ) -> "EngineProcess":
        """Spawn the engine process and wait until its engine has loaded; raises what loading raised."""
        return LoadingEngineProcess(config, setup).wait(on_crash)

    def start(self) -> None:
        """Start taking the engine process's messages (it steps as soon as it has requests)."""
        self._reader.start()

    @property
    def is_running(self) -> bool:
        """True while the engine process runs, draining after `stop` included."""
        return not self._ended.is_set() and self._process.is_alive()

    @property
    def is_alive(self) -> bool:
        """True while the engine process runs and has not been asked to stop."""
        return self.is_running and not self._stopping.is_set()

    def stop(self, timeout: float = 30.0) -> None:
        """Let running requests finish for up to ``timeout`` seconds, abort the rest, wait for the process to exit."""
        if not self._stopping.is_set():
            self._stopping.set()
            self._send(("stop", timeout))
        self._process.join(timeout + 10)
        if self._process.is_alive():
            log.error("the engine process did not stop in time; killing it")
            self._process.kill()
            self._process.join()
        self._ended.wait(10)

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
        """Queue a request and yield its outputs until it finishes; aborts it if the caller stops listening."""

        # Truncated here too, so that the prompt put back on outputs is the one the engine saw
        # (a prompt with images is not: the engine refuses to cut it).
        if not images:
            prompt_token_ids, prompt = truncated_prompt(
                prompt_token_ids, prompt, params, self.model.max_model_len, self.tokenizer
            )

        def add() -> Future:
            if not self.is_alive:
                raise EngineDeadError("the engine is not running")
            added: Future = Future()
            self._added[req_id] = added
            self._prompts[req_id] = (prompt, prompt_token_ids)
            exported = attributes
            if attributes is not None and self._setup.export_attributes is not None:
                exported = self._setup.export_attributes(attributes)
            self._send(
                ("add", req_id, prompt_token_ids, params, prompt, exported, lora_name, images)
            )
            return added

        return self._streams.listen(req_id, add, self.abort, params.output_kind)

    def abort(self, req_id: str) -> None:
        """Ask the engine to abort a request (no-op if it already ended)."""
        self._send(("abort", req_id, time.time_ns()))

    async def snapshot(self, with_requests: bool = False) -> EngineSnapshot:
        """A fresh snapshot, taken in the engine process between steps."""
        return await asyncio.wrap_future(
            self.call(operator.methodcaller("snapshot", with_requests))
        )

    async def load_lora(self, name: str, path: str) -> LoRAInfo:
        """Load a PEFT adapter under ``name`` in the engine process, between steps."""
        return await asyncio.wrap_future(
            self.call(functools.partial(add_lora, name=name, path=path))
        )

    async def unload_lora(self, name: str) -> None:
        """Unload an adapter in the engine process, between steps."""
        await asyncio.wrap_future(self.call(functools.partial(remove_lora, name=name)))

    def tool_call_parser(self, name: str) -> ToolCallParser | None:
        """The tool-call parser a plugin of the engine provides under ``name`` (a copy; parsers keep no state)."""
        return self.call(functools.partial(tool_call_parser, name=name)).result(60)

    def reasoning_parser(self, name: str) -> ReasoningParser | None:
        """The reasoning parser a plugin of the engine provides under ``name`` (a copy)."""
        return self.call(functools.partial(reasoning_parser, name=name)).result(60)

    async def metric_families(self, collect: Callable[[], list]) -> list:
        """``collect()`` run in the engine process beside its loop (a scrape waits for no step): its metrics."""
        return await asyncio.wrap_future(self._request("collect", collect))

    def call(self, function: Callable) -> Future:
        """``function(engine)`` run in the engine process between steps; it and its result must pickle."""
        return self._request("call", function)

    def _request(self, kind: str, function: Callable) -> Future:
        result: Future = Future()
        if not self.is_running:
            result.set_exception(EngineDeadError("the engine is not running"))
            return result
        call_id = next(self._call_ids)
        self._calls[call_id] = result
        self._send((kind, call_id, function))
        return result

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._commands.send(message)
        except OSError:  # the process has gone: the reader fails whatever waited on it
            pass

    def _read(self) -> None:
        crash = None
        try:
            while True:
                message = self._events.recv()
                kind = message[0]
                if kind == "step":
                    self._on_step(message[1], message[2])
                elif kind == "added":
                    if message[2] is not None:
                        self._prompts.pop(message[1], None)
                    _resolve(self._added.pop(message[1], None), message[2] is None, message[2])
                elif kind == "result":
                    _resolve(self._calls.pop(message[1], None), message[2], message[3])
                elif kind == "feedback" and self._setup.apply_feedback is not None:
                    self._setup.apply_feedback(message[1])
                elif kind == "crashed":
                    crash = message[1]
        except (EOFError, OSError):
            pass
        self._ended.set()
        self._process.join(5)
        if crash is None and not self._stopping.is_set():
            crash = f"the engine process exited with code {self._process.exitcode}"
        error = EngineDeadError(f"engine loop crashed: {crash}" if crash else "the engine stopped")
        for future in [*self._added.values(), *self._calls.values()]:
            _resolve(future, False, error)
        self._streams.fail_all(error)
        self._prompts.clear()
        if crash is not None:
            log.error("engine process failed: %s", crash)
            if self._on_crash is not None:
                self._on_crash(error)

    def _on_step(self, rows: list[WireOutput], snapshot: EngineSnapshot | None) -> None:
        if snapshot is not None:
            self.latest = snapshot
        outputs = from_wire(rows)
        for output in outputs:
            prompts = self._prompts.pop if output.finished else self._prompts.get
            output.prompt, output.prompt_token_ids = prompts(output.request_id, (None, []))
        self._streams.deliver(outputs)


def _resolve(future: Future | None, ok: bool, value) -> None:
    if future is None or not future.set_running_or_notify_cancel():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
