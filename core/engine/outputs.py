"""What the engine hands back per request: vLLM-shaped output objects."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """The log-probability of one sampled token and its top alternatives (token id -> logprob)."""

    token_id: int
    logprob: float
    top: dict[int, float]


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence so far: cumulative text and token ids, and why it stopped (None while running)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[Logprob] | None = None


@dataclass(slots=True)
class RequestOutput:
    """A request's state as seen by a caller; ``finished`` is True on the last one."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
