"""What the HTTP API needs of a running engine: `AsyncEngine` (a thread) and `EngineProcess` (a process)."""

from collections.abc import AsyncIterator, Callable
from typing import Protocol

from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.reasoning import ReasoningParser
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.snapshot import EngineSnapshot, ModelDescription
from spyglass.core.engine.tool_calls import ToolCallParser
from spyglass.core.tokenizer import Tokenizer


class EngineClient(Protocol):
    """A started engine front: requests in, outputs back (of the kind each request asks for), state as snapshots."""

    model: ModelDescription
    tokenizer: Tokenizer
    placement: str
    """Where the engine runs: ``"thread"`` (of this process) or ``"process"`` (its own)."""

    @property
    def latest(self) -> EngineSnapshot:
        """The engine's state after its last step (may lag by one step)."""

    @property
    def is_running(self) -> bool:
        """True while the engine runs, draining after `stop` included."""

    @property
    def is_alive(self) -> bool:
        """True while the engine runs and has not been asked to stop."""

    def start(self) -> None:
        """Start serving (after `load`)."""

    def stop(self, timeout: float = 30.0) -> None:
        """Let requests finish for up to ``timeout`` seconds, abort the rest, stop (blocking)."""

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
        """Outputs until the finished one; `InvalidRequestError` before any for a rejected request.
        ``lora_name`` runs the request with that loaded LoRA adapter; ``images`` are a vision
        model's prompt's (`image_inputs.place_images`)."""

    def abort(self, req_id: str) -> None:
        """Abort a request if it is still alive."""

    async def snapshot(self, with_requests: bool = False) -> EngineSnapshot:
        """A fresh snapshot taken between steps."""

    async def load_lora(self, name: str, path: str) -> LoRAInfo:
        """Load a PEFT adapter under ``name`` between steps; ValueError when it cannot run here."""

    async def unload_lora(self, name: str) -> None:
        """Unload an adapter: new requests cannot name it, running ones finish with it."""

    def tool_call_parser(self, name: str) -> ToolCallParser | None:
        """The tool-call parser a plugin provides under ``name``, if any."""

    def reasoning_parser(self, name: str) -> ReasoningParser | None:
        """The reasoning parser a plugin provides under ``name``, if any."""

    async def metric_families(self, collect: Callable[[], list]) -> list | None:
        """``collect()`` run where the engine records its metrics, or None if that is this process."""
