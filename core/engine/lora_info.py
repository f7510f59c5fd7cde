"""What names a LoRA adapter and what the engine tells about one; no torch, so the API process imports them."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    """vLLM's handle on an adapter: its name, a number (kept for vLLM's signature), its directory.

    `LLM.generate(..., lora_request=LoRARequest("sql", 1, "/adapters/sql"))` loads the adapter the
    first time its name is seen and runs the prompts with it."""

    lora_name: str
    lora_int_id: int = 0
    lora_path: str = ""


@dataclass(frozen=True, slots=True)
class LoRAInfo:
    """What the engine tells about a loaded adapter (`LLMEngine.loras`, ``/v1/models``)."""

    name: str
    path: str
    rank: int
    num_parameters: int
