"""Immutable views of a running engine: what a front end, an HTTP route or a dashboard may read.

A snapshot is taken in the engine's own thread between two steps (`LLMEngine.snapshot`), so its
numbers agree with each other; after that it is plain data that any thread can keep and read.
Nothing here lets a reader reach the scheduler, the block pool or a live `Request`.
"""

from dataclasses import dataclass, field

from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.sampling_defaults import SamplingDefaults
from spyglass.core.engine.video_sampling import DEFAULT_VIDEO_SAMPLING, VideoSampling
from spyglass.core.models.vision_config import VisionConfig


@dataclass(frozen=True, slots=True)
class RequestSnapshot:
    """One request as the engine sees it at the snapshot."""

    request_id: str
    status: str
    """``waiting``, ``running`` or ``preempted`` (finished requests leave the engine at once)."""
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    """Prompt tokens whose KV came from the prefix cache."""
    num_blocks: int
    """KV blocks the request holds now."""
    num_preemptions: int
    arrival_time: float
    """``time.monotonic()`` at arrival."""
    lora_name: str | None = None
    """The LoRA adapter the request runs with (None: the base model)."""
    num_images: int = 0
    """Images in the prompt (a vision model's)."""
    priority: int = 0
    """Its place in a priority policy's queue (lower first; OpenAI's ``service_tier`` maps here)."""


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """Queue lengths and KV usage of one engine, and (when asked for) every live request."""

    num_waiting: int
    """Requests waiting for their first schedule or, after a preemption, to resume."""
    num_running: int
    num_requests: int
    """Every request the engine holds: waiting, running or preempted."""
    num_blocks: int
    num_free_blocks: int
    """Blocks no request holds (cached prefix blocks included: they can be reclaimed)."""
    requests: tuple[RequestSnapshot, ...] = ()

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV blocks held by requests, 0.0 to 1.0."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    def request(self, request_id: str) -> RequestSnapshot | None:
        """The snapshot of ``request_id``, if it was taken with requests and the request was alive."""
        return next((r for r in self.requests if r.request_id == request_id), None)


@dataclass(frozen=True, slots=True)
class ModelDescription:
    """What the engine serves; fixed for the engine's life."""

    model_name: str
    max_model_len: int
    vocab_size: int
    lora_enabled: bool = False
    """Whether requests may name LoRA adapters (`EngineConfig.enable_lora`)."""
    loras: tuple[LoRAInfo, ...] = ()
    """The adapters loaded at start."""
    labels: tuple[str, ...] = ()
    """A sequence classifier's class names, in order (none for other models)."""
    vision: VisionConfig | None = None
    """A vision model's image token and preprocessing (None: the model reads no images)."""
    max_images_per_prompt: int | None = None
    """The most images a prompt may hold (``--limit-mm-per-prompt``; None: the context bounds it)."""
    max_videos_per_prompt: int | None = None
    """The most videos a prompt may hold (as ``max_images_per_prompt``)."""
    video_sampling: VideoSampling = DEFAULT_VIDEO_SAMPLING
    """Which frames of a video file are read (``--media-io-kwargs``, the model's own rate)."""
    sampling_defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    """What a request that leaves sampling settings out gets (``--generation-config``)."""
    orders_by_priority: bool = False
    """Whether the scheduling policy orders requests by their ``priority`` (``reads_priority``)."""
