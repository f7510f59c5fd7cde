"""A request's state inside the engine: its tokens, how many are computed, its blocks and its timeline."""

import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spyglass.core.engine.image_inputs import ImageInput, image_digests
from spyglass.core.engine.mrope_positions import PromptPositions
from spyglass.core.engine.outputs import Logprob
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.engine.token_constraint import TokenConstraint

if TYPE_CHECKING:  # imported when a seeded request needs a generator: plugins load without torch
    import torch

    from spyglass.core.models.lora import LoRAAdapter


class RequestStatus(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a request ended; the values are the OpenAI / vLLM ``finish_reason`` strings."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(slots=True)
class RequestTimes:
    """Monotonic timestamps (``time.monotonic()``) of a request's phases; 0.0 until reached."""

    arrival: float = 0.0
    first_scheduled: float = 0.0
    first_token: float = 0.0
    last_token: float = 0.0
    finished: float = 0.0


class Request:
    """One sequence being generated.

    ``num_computed_tokens`` chases ``num_tokens`` (prompt + output + draft tokens): each step
    computes some of the difference, whether that is a prefill chunk, one decode token or
    draft tokens to verify. There is no prefill or decode mode.

    Between a step's launch and the commit of its tokens, ``num_in_flight_tokens`` counts the
    tokens it computes and ``num_pending_tokens`` the output token it samples, whose id only the
    device knows yet: a step scheduled meanwhile (async scheduling) starts after both.
    """

    def __init__(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        prompt: str | None = None,
        max_tokens: int = 16,
        eos_token_ids: tuple[int, ...] = (),
        arrival_time: float | None = None,
        attributes: dict[str, Any] | None = None,
        images: tuple[ImageInput, ...] = (),
    ):
        self.req_id = req_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.max_tokens = max_tokens
        self.eos_token_ids = eos_token_ids
        self.attributes = dict(attributes or {})
        # A vision model's prompt: its images, and (kept by the runner while prompt positions
        # they fill are still to compute) their embeddings by index.
        self.images = images
        self.image_embeds: dict[int, torch.Tensor] = {}
        # M-RoPE's positions of a prompt with images (Qwen2-VL; set by the engine), else None.
        self.rope_positions: PromptPositions | None = None
        self.output_token_ids: list[int] = []
        self.spec_token_ids: list[int] = []
        self.logprobs: list[Logprob] | None = [] if sampling_params.logprobs is not None else None
        # With prompt_logprobs: the first prompt token's (None), then one per prompt position computed.
        self.prompt_logprobs: list[Logprob | None] | None = (
            None if sampling_params.prompt_logprobs is None else [None]
        )
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_pending_tokens = 0
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        self.num_spec_steps = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        # A pooling request's answer (embedding or class probabilities), once the step that
        # finished its prompt computed it; set by the engine: the prompt positions it pools
        # (`request_intake.pool_range`). ``pool_sum`` adds up the final hidden states of those
        # before ``pooled_upto`` that committed steps computed (a prompt in several chunks).
        self.pooled: list[float] | None = None
        self.pool_range: tuple[int, int] | None = None
        self.pool_sum: torch.Tensor | None = None
        self.pooled_upto = 0
        self.times = RequestTimes(
            arrival=time.monotonic() if arrival_time is None else arrival_time
        )
        self.generator: torch.Generator | None = None
        # Set by the engine for a request with structured output: the grammar matcher of its output.
        self.constraint: TokenConstraint | None = None
        # Set by the engine for a request that names a LoRA adapter: its deltas run on this request's rows.
        self.lora: LoRAAdapter | None = None
        # Set by the engine from ``bad_words``: each word's token ids (`bad_word_token_ids`).
        self.bad_word_ids: tuple[tuple[int, ...], ...] = ()
        # Whether sampling changes this request's logits (bias, allowed or banned tokens): a
        # step's other rows are passed over without looking at their parameters.
        self.adjusts_logits = bool(
            sampling_params.logit_bias
            or sampling_params.allowed_token_ids is not None
            or sampling_params.min_tokens
            or sampling_params.bad_words
        )
        if sampling_params.seed is not None:
            from torch import Generator

            self.generator = Generator().manual_seed(sampling_params.seed)

    @property
    def lora_name(self) -> str | None:
        """The name of the LoRA adapter the request runs with (None: the base model)."""
        return None if self.lora is None else self.lora.name

    @property
    def cache_namespace(self) -> tuple | None:
        """What keeps the request's KV blocks apart from other requests' with the same tokens:
        its LoRA adapter's name and load (the keys and values differ) and its ``cache_salt`` (a
        tenant's own cache); None for neither. The prefix cache shares blocks only within one."""
        salt = self.sampling_params.cache_salt
        if self.lora is None and salt is None:
            return None
        adapter = None if self.lora is None else (self.lora.name, self.lora.load_id)
        return adapter, salt

    def image_digests(self, start: int, end: int) -> tuple[str, ...]:
        """The digests of the prompt's images that fill any of positions ``[start, end)``: what,
        besides the tokens, decides the KV of those positions (empty for a prompt of text)."""
        return image_digests(self.images, start, end) if self.images else ()

    @property
    def reads_every_prompt_row(self) -> bool:
        """Whether a step must compute the prompt's positions themselves, not take them from the
        prefix cache: for prompt logprobs, or for pooling that reads more than the last token."""
        pooled = self.pool_range is not None and self.pool_range[0] < self.num_prompt_tokens - 1
        return pooled or self.prompt_logprobs is not None

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far (drafts not included)."""
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        """Prompt, output (pending ones too) and draft tokens: what the next steps must compute."""
        return self.num_tokens + self.num_pending_tokens + len(self.spec_token_ids)

    @property
    def num_launched_tokens(self) -> int:
        """Tokens computed or being computed by a launched step: where the next step starts."""
        return self.num_computed_tokens + self.num_in_flight_tokens

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output token ids."""
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Token ids ``[start, end)`` across prompt, output and drafts, copying only those (a decode
        step's one token must not cost a copy of the whole output). Pending tokens have no id here:
        positions from `num_tokens` on give nothing while any is pending."""
        ids: list[int] = []
        for part in (self.prompt_token_ids, self.output_token_ids, self.spec_token_ids):
            if start < len(part) and end > 0:
                ids += part[max(start, 0) : end]
            start, end = start - len(part), end - len(part)
        return ids

    @property
    def is_finished(self) -> bool:
        """True once the request has a finish reason."""
        return self.status == RequestStatus.FINISHED

    def __repr__(self) -> str:
        return (
            f"Request({self.req_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
