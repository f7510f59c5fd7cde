"""Engine configuration: one slotted dataclass, validated once."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spyglass.core.engine.video_sampling import DEFAULT_VIDEO_FRAMES
from spyglass.core.models.model_config import POOLING_TYPES
from spyglass.kernels import cpu_isa

# torch is imported when a dtype or device is asked for, so the CLI starts without it; the
# engine carries its plugins' telemetry settings without using them.
if TYPE_CHECKING:
    import torch

    from spyglass.telemetry.settings import TelemetrySettings

DTYPE_NAMES = ("float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "none", "int8", "dual")
# auto: the model's dtype. float16: half the bytes of a float32 model's cache on the CPU.
KV_CACHE_DTYPES = ("auto", "float16")


def dtype_named(name: str) -> "torch.dtype":
    """The torch dtype called ``name`` (one of `DTYPE_NAMES`)."""
    import torch

    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {list(DTYPE_NAMES)}, got {name!r}")
    return getattr(torch, name)


def dtype_name(dtype: "torch.dtype") -> str:
    """``dtype``'s name without the ``torch.`` prefix (the inverse of `dtype_named`)."""
    return str(dtype).removeprefix("torch.")


def parse_bytes(value: int | str) -> int:
    """``2147483648``, ``"2GiB"``, ``"512MiB"`` or ``"1.5GB"`` as a number of bytes."""
    if isinstance(value, int):
        return value
    units = {
        "kib": 1 << 10,
        "mib": 1 << 20,
        "gib": 1 << 30,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "b": 1,
    }
    text = value.strip().lower()
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine needs to start.

    ``model`` is a GGUF file, an HF directory, or None for the default model. ``dtype`` "auto"
    picks bfloat16 on CUDA and on CPUs with native bf16 arithmetic (AMX, AVX512-BF16, AVX-NE-CONVERT),
    float32 on every other CPU (where bf16 is emulated and several times slower).
    ``kv_cache_memory`` is the KV budget in bytes; ``num_kv_blocks`` overrides it exactly.
    ``speculative`` names a draft proposer plugin (ngram, draft, self); it is asked for up to
    ``num_speculative_tokens`` drafts per decoding request each step. ``plugin_options`` holds
    plugins' own settings (``--plugin-option draft_model=PATH``), read by the plugins at start.
    ``quantization`` (`core.quantization`): auto keeps a GGUF file's quantized blocks on the CPU,
    none dequantizes at load, int8 stores the matrices as weight-only int8 (Q8_0), dual keeps the
    blocks for steps of a few rows and a bf16 copy of each matrix for bigger steps (AMX).
    ``kv_cache_dtype`` auto stores keys and values in the model's dtype; float16 (float32 models on
    the CPU) halves the cache's bytes, which decode attention streams each step, and doubles its blocks.
    ``engine_id`` names the engine in metrics (the ``engine`` label), traces and logs; None gives a
    process-unique one ("0", "1", ...). ``telemetry`` is what the engine's plugins emit, passed to them
    untouched; None means the process default (`spyglass.telemetry.settings.current()`, set by the CLI).
    ``cuda_graphs`` replays decode steps (and verify steps, with speculation) from CUDA graphs;
    ``cuda_graph_tokens`` > 0 also replays other steps of up to that many new tokens (a prompt
    chunk among decodes: any step while requests arrive) from packed graphs of 32, 64, ... tokens,
    for models without experts (inside a graph the experts run densely); 0 runs them eagerly.
    ``async_output`` detokenizes, builds outputs and runs the step hooks of one step while the
    device runs the next (`LLMEngine.step`); None turns it on for CUDA, where the device runs apart
    from the host (on the CPU there is nothing to overlap). ``async_scheduling`` also schedules and
    launches the next step before the previous one's token ids reach the host (they are read on the
    device), so the device always has a step queued; it turns async output on (None) or refuses it
    off, and excludes speculation. None turns it on with CUDA for one process without speculation
    (on the H200 it shortened decode steps of batch 64 or less, 1.97 -> 1.59 ms for a 1B model).
    ``tensor_parallel_size`` > 1 splits the model's heads, MLP and vocabulary over that many processes
    (this one and N-1 workers; gloo on the CPU, NCCL on CUDA devices 0..N-1): see docs/tensor_parallel.md.
    ``enable_lora`` lets requests run with LoRA adapters (PEFT directories) of rank up to
    ``max_lora_rank``; ``lora_modules`` maps names to the adapters loaded at start; ``max_loras``
    caps the distinct adapters the running batch holds (None: no cap), as vLLM's option does.
    ``pooling_type`` (``last``, ``mean``, ``cls``) is how embeddings pool the prompt; None takes
    the checkpoint's (its sentence-transformers Pooling config or GGUF metadata; else ``last``).
    ``limit_mm_per_prompt`` caps a prompt's inputs of a modality (vLLM's option; ``{"image": 4,
    "video": 1}``: at most 4 images and one video); a modality it does not name is bounded by the
    context alone.
    ``image_cache_tokens`` bounds the embeddings of recently encoded images a vision model keeps
    for other requests with the same image (0: none kept). ``mm_processor_kwargs`` (vLLM's
    option) changes a vision model's image processor settings for every request
    (`processor_options`: Qwen2-VL's ``min_pixels`` / ``max_pixels``, Idefics3's
    ``do_image_splitting``). ``media_io_kwargs`` (vLLM's option) sets how media are read:
    ``{"video": {"num_frames": N}}``, the most frames read from a video file, evenly spaced (32 by
    default; `video_frames`; Qwen3-VL's sampled by the video's time, at most that many).
    ``generation_config`` is where requests' sampling defaults come from, as vLLM's option says
    (`sampling_defaults`: ``auto``, the model's generation_config.json; ``vllm``, none; or a
    directory holding one), with ``override_generation_config`` (keys of a generation config) on
    top. ``chat_template`` (a file or the jinja itself, vLLM's ``--chat-template``) replaces the
    model's chat template.
    """

    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    kv_cache_memory: int = 2 << 30
    num_kv_blocks: int | None = None
    scheduling_policy: str = "fcfs"
    attention_backend: str = "auto"
    cuda_graphs: bool = True
    cuda_graph_tokens: int = 0
    async_output: bool | None = None
    async_scheduling: bool | None = None
    plugins: list[str] | None = None
    disabled_plugins: list[str] = field(default_factory=list)
    num_threads: int | None = None
    seed: int = 0
    speculative: str | None = None
    num_speculative_tokens: int = 4
    plugin_options: dict[str, str] = field(default_factory=dict)
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"
    engine_id: str | None = None
    telemetry: "TelemetrySettings | None" = None
    tensor_parallel_size: int = 1
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int | None = None
    lora_modules: dict[str, str] = field(default_factory=dict)
    pooling_type: str | None = None
    limit_mm_per_prompt: dict[str, int] = field(default_factory=dict)
    image_cache_tokens: int = 16384
    mm_processor_kwargs: dict = field(default_factory=dict)
    media_io_kwargs: dict = field(default_factory=dict)
    generation_config: str = "auto"
    override_generation_config: dict = field(default_factory=dict)
    chat_template: str | None = None
    stream_interval: int = 1

    @property
    def video_frames(self) -> int:
        """The most frames read from a video file (``media_io_kwargs``; vLLM's default, 32)."""
        return self.media_io_kwargs.get("video", {}).get("num_frames", DEFAULT_VIDEO_FRAMES)

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise ValueError(
                f"dtype must be auto or one of {list(DTYPE_NAMES)}, got {self.dtype!r}"
            )
        if self.block_size < 1 or self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("block_size, max_num_seqs and max_num_batched_tokens must be positive")
        if self.cuda_graph_tokens < 0:
            raise ValueError(f"cuda_graph_tokens must be 0 or more, got {self.cuda_graph_tokens}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be at least 1, got {self.tensor_parallel_size}"
            )
        if self.lora_modules and not self.enable_lora:
            raise ValueError("lora_modules need enable_lora (--enable-lora)")
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise ValueError("LoRA adapters do not run with tensor parallelism yet")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be at least 1, got {self.max_lora_rank}")
        if self.max_loras is not None and self.max_loras < 1:
            raise ValueError(f"max_loras must be at least 1, got {self.max_loras}")
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}"
            )
        for modality, limit in self.limit_mm_per_prompt.items():
            if modality not in ("image", "video") or not isinstance(limit, int) or limit < 0:
                raise ValueError(
                    'limit_mm_per_prompt takes {"image": N, "video": M} with N, M >= 0 (images '
                    f"and videos are the modalities served), got {self.limit_mm_per_prompt!r}"
                )
        _check_media_io(self.media_io_kwargs)
        if self.stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {self.stream_interval}")
        if self.image_cache_tokens < 0:
            raise ValueError(
                f"image_cache_tokens must be at least 0, got {self.image_cache_tokens}"
            )

    def torch_device(self) -> "torch.device":
        """The device to run on: CUDA when available unless told otherwise."""
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> "torch.dtype":
        """The model's dtype (the KV cache's too unless `kv_cache_dtype` says otherwise)."""
        return self.dtype_choice()[0]

    def kv_cache_torch_dtype(
        self, model_dtype: "torch.dtype", device: "torch.device"
    ) -> "torch.dtype":
        """The KV cache's dtype for a model running in ``model_dtype`` on ``device``.

        Raises ``ValueError`` for float16 anywhere but under a float32 model on the CPU (where the
        kernels widen it to float32 as they load it).
        """
        import torch

        if self.kv_cache_dtype == "auto":
            return model_dtype
        if device.type != "cpu" or model_dtype != torch.float32:
            raise ValueError(
                f"--kv-cache-dtype {self.kv_cache_dtype} is for float32 models on the CPU; this engine "
                f"runs {dtype_name(model_dtype)} on {device.type} (use --kv-cache-dtype auto)"
            )
        return dtype_named(self.kv_cache_dtype)

    def dtype_choice(self) -> tuple["torch.dtype", str]:
        """The model's dtype, and why it was chosen (for the engine's start line)."""
        import torch

        if self.dtype != "auto":
            return dtype_named(self.dtype), "asked for"
        if self.torch_device().type == "cuda":
            return torch.bfloat16, "auto on CUDA"
        if cpu_isa.has_native_bf16():
            return torch.bfloat16, "auto: the CPU has native bf16"
        return torch.float32, "auto: the CPU has no native bf16"

    def async_modes(self, device: "torch.device") -> tuple[bool, bool]:
        """(async output, async scheduling) on ``device``. Emitting a step while the next one runs
        pays where the device runs apart from the host, so both are on with CUDA unless refused
        (async scheduling not with speculation or tensor parallelism, where it is opt-in or
        refused); async scheduling emits while the next step runs, so it brings async output too.
        Raises ``ValueError`` for a combination that cannot run."""
        async_scheduling = (
            device.type == "cuda"
            and self.async_output is not False
            and not self.speculative
            and self.tensor_parallel_size == 1
            if self.async_scheduling is None
            else self.async_scheduling
        )
        async_output = (
            device.type == "cuda" or async_scheduling
            if self.async_output is None
            else self.async_output
        )
        if async_scheduling and not async_output:
            raise ValueError("--async-scheduling needs async output (drop --no-async-output)")
        if async_scheduling and self.speculative:
            raise ValueError(
                "--async-scheduling does not combine with --speculative: drafts need the last token"
            )
        return async_output, async_scheduling


def _check_media_io(options: dict) -> None:
    """ValueError unless ``options`` is ``{}`` or ``{"video": {"num_frames": N}}``, N >= 1."""
    video = options.get("video", {})
    video = video if isinstance(video, dict) else {"num_frames": None}
    frames = video.get("num_frames", 1)
    whole = isinstance(frames, int) and not isinstance(frames, bool)
    if set(options) - {"video"} or set(video) - {"num_frames"} or not whole or frames < 1:
        raise ValueError(
            'media_io_kwargs takes {"video": {"num_frames": N}} with N >= 1 (the most frames '
            f"read from a video file), got {options!r}"
        )
