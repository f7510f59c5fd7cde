"""The engine process's half of `EngineProcess`: load the engine, run its loop, talk over two pipes.

Messages from the server (``commands``): ``("add", req_id, prompt_token_ids, params, prompt,
attributes, lora_name, images)``, ``("abort", req_id, epoch_ns)``, ``("call", call_id, function)`` (``function(engine)``
between steps), ``("collect", call_id, function)`` (``function()`` in the main thread, beside the
loop: a metrics scrape) and ``("stop", timeout)``.
Messages to it (``events``): ``("ready", model, tokenizer)`` or ``("failed", error)`` once at
start, then ``("step", outputs, snapshot)`` (`output_wire` tuples), ``("added", req_id,
error)``, ``("result", call_id, ok, value)``, ``("feedback", items)`` and ``("crashed", message)``.
"""

import logging
import pickle
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine_loop import EngineLoop
from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.output_wire import WireOutput
from spyglass.core.engine.reasoning import ReasoningParser
from spyglass.core.engine.snapshot import EngineSnapshot
from spyglass.core.engine.tool_calls import ToolCallParser

if TYPE_CHECKING:  # the engine is imported in the engine process only (`run_engine_process`)
    from spyglass.core.engine.engine import LLMEngine

log = logging.getLogger("spyglass.engine")


@dataclass(frozen=True, slots=True)
class ProcessSetup:
    """What the layers above the engine do across the process boundary; each field must pickle.

    ``prepare`` runs first in the engine process (logging, telemetry settings).
    ``export_attributes`` turns a request's attributes into ones that pickle, in the server;
    ``import_attributes`` turns them back, in the engine process (e.g. a trace context).
    ``take_feedback`` (engine process, after each command and step) returns what is to go back to
    the server before the outputs that follow, where ``apply_feedback`` gets it (e.g. what a plugin
    set on the HTTP span). ``abandoned(attributes, epoch_ns)`` is told, in the engine process,
    when a request's listener left, before the request is aborted.
    """

    prepare: Callable[[], None] | None = None
    export_attributes: Callable[[dict], dict] | None = None
    import_attributes: Callable[[dict], dict] | None = None
    take_feedback: Callable[[], list] | None = None
    apply_feedback: Callable[[list], None] | None = None
    abandoned: Callable[[dict, int], None] | None = None


def run_engine_process(
    config: EngineConfig, setup: ProcessSetup, commands: Connection, events: Connection
) -> None:
    """The engine process's main: load, announce, serve commands until told to stop or the server goes.

    SIGINT and SIGTERM are ignored: sent to the whole process group (Ctrl-C, systemd), they are the
    server's to handle, which drains this process and then closes its pipe.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if setup.prepare is not None:
        setup.prepare()
    # Here, not at the top: the server imports this module without the engine (torch, models).
    from spyglass.core.engine.engine import LLMEngine

    try:
        engine = LLMEngine(config)
    except BaseException as error:
        log.exception("the engine failed to load")
        events.send(("failed", portable(error)))
        raise SystemExit(1) from None
    engine.send_wire_outputs()
    events.send(("ready", engine.describe(), engine.tokenizer))
    child = _EngineChild(engine, setup, events)
    raise SystemExit(child.serve(commands))


def tool_call_parser(engine: "LLMEngine", name: str) -> ToolCallParser | None:
    """The tool-call parser a plugin of ``engine`` provides under ``name`` (sent to the server by `EngineProcess`)."""
    return engine.hooks.spyglass_tool_call_parser(name=name)


def reasoning_parser(engine: "LLMEngine", name: str) -> ReasoningParser | None:
    """The reasoning parser a plugin of ``engine`` provides under ``name`` (sent to the server by `EngineProcess`)."""
    return engine.hooks.spyglass_reasoning_parser(name=name)


def add_lora(engine: "LLMEngine", name: str, path: str) -> LoRAInfo:
    """Load a LoRA adapter into ``engine`` (sent to the engine process by `EngineProcess.load_lora`)."""
    return engine.add_lora(name, path)


def remove_lora(engine: "LLMEngine", name: str) -> None:
    """Unload a LoRA adapter from ``engine`` (sent by `EngineProcess.unload_lora`)."""
    engine.remove_lora(name)


class _EngineChild:
    def __init__(self, engine: "LLMEngine", setup: ProcessSetup, events: Connection):
        self._engine = engine
        self._setup = setup
        self._events = events
        self._sent_snapshot: EngineSnapshot | None = None
        self._crashed = False
        self._send_lock = (
            threading.Lock()
        )  # the loop thread and the main thread (scrapes) both write
        self._loop = EngineLoop(engine, self._on_step, self._on_crash)

    def serve(self, commands: Connection) -> int:
        """Hand each command to the loop until ``stop``, the server's end closing, or a crash; the exit code."""
        self._loop.start()
        while self._loop.is_running:
            if not commands.poll(0.2):
                continue
            try:
                message = commands.recv()
            except (EOFError, OSError):  # the server has gone: nobody is left to answer
                self._loop.stop(0)
                break
            if message[0] == "stop":
                self._loop.stop(message[1])
                break
            if message[0] == "collect":
                self._answer(message[1], message[2])
            else:
                self._loop.submit(lambda message=message: self._handle(message))
        return 1 if self._crashed else 0

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "add":
            self._add(*message[1:])
        elif kind == "abort":
            self._abort(*message[1:])
        elif kind == "call":
            self._answer(message[1], lambda: message[2](self._engine))
        self._send_feedback()

    def _abort(self, req_id: str, when_ns: int) -> None:
        request = self._engine.requests.get(req_id)
        if request is not None and self._setup.abandoned is not None:
            self._setup.abandoned(request.attributes, when_ns)
        output = self._engine.abort(req_id)
        self._send_feedback()
        if output is not None:
            self._send(("step", [output], None))

    def _send_feedback(self) -> None:
        if self._setup.take_feedback is not None and (items := self._setup.take_feedback()):
            self._send(("feedback", items))

    def _answer(self, call_id: int, function: Callable[[], object]) -> None:
        try:
            value = function()
            pickle.dumps(value)  # a value that cannot travel is an error the caller sees
            result = ("result", call_id, True, value)
        except Exception as error:
            result = ("result", call_id, False, portable(error))
        self._send(result)

    def _add(self, req_id, prompt_token_ids, params, prompt, attributes, lora_name, images) -> None:
        try:
            if attributes is not None and self._setup.import_attributes is not None:
                attributes = self._setup.import_attributes(attributes)
            self._engine.add_request(
                req_id, prompt_token_ids, params, prompt, attributes, lora_name, images
            )
        except Exception as error:
            self._send(("added", req_id, portable(error)))
        else:
            self._send(("added", req_id, None))

    def _on_step(self, outputs: list[WireOutput], snapshot: EngineSnapshot) -> None:
        self._send_feedback()
        changed = snapshot != self._sent_snapshot
        if outputs or changed:
            self._sent_snapshot = snapshot
            self._send(("step", outputs, snapshot if changed else None))

    def _on_crash(self, error: BaseException) -> None:
        self._crashed = True
        self._send(("crashed", f"{type(error).__name__}: {error}"))

    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                self._events.send(message)
        except OSError:  # the server has gone; the command loop sees it too
            pass


def portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
