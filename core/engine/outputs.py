"""What the engine hands back per request: vLLM-shaped output objects."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class Logprob:
    """The log-probability of one sampled token and its top alternatives (token id -> logprob)."""

    token_id: int
    logprob: float
    top: dict[int, float]
    rank: int | None = None
    """The token's rank in its distribution (1 for the most likely); set on prompt logprobs."""


@dataclass(slots=True)
class CompletionOutput:
    """One generated sequence: its text and token ids (all so far, or those since the previous output,
    as the request's `RequestOutputKind` says), and why it stopped (None while running)."""

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
    """On the final output of a request that speculation drafted for: ``num_draft_tokens`` (its
    drafts verified) and ``num_accepted_tokens`` (those accepted); else empty."""
    prompt_logprobs: list[Logprob | None] | None = None
    """With ``SamplingParams.prompt_logprobs``: one per prompt token, None for the first; a delta
    request's first output carries them."""
    pooled: list[float] | None = None
    """A pooling request's answer (``SamplingParams.pooling``) on its final output: its
    embedding, or its class probabilities (`PoolingParams.task`)."""


@dataclass(slots=True)
class EmbeddingOutput:
    """A prompt's embedding (vLLM's class of the same name)."""

    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        """The vector's length."""
        return len(self.embedding)


@dataclass(slots=True)
class EmbeddingRequestOutput:
    """What `LLM.embed` returns per prompt, as vLLM shapes it: ``outputs.embedding`` is the vector."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass(slots=True)
class ScoringOutput:
    """A pair's score (vLLM's class of the same name): the cosine similarity of its embeddings."""

    score: float


@dataclass(slots=True)
class ScoringRequestOutput:
    """What `LLM.score` returns per pair, as vLLM shapes it; ``prompt_token_ids`` are the first
    text's then the second's."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True


@dataclass(slots=True)
class ClassificationOutput:
    """A prompt's class probabilities (vLLM's class of the same name; raw logits when the request
    turned the activation off)."""

    probs: list[float]

    @property
    def num_classes(self) -> int:
        """How many classes the model tells apart."""
        return len(self.probs)


@dataclass(slots=True)
class ClassificationRequestOutput:
    """What `LLM.classify` returns per prompt, as vLLM shapes it: ``outputs.probs``."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True


def joined(deltas: list[RequestOutput]) -> RequestOutput:
    """One request's delta outputs, in order, as one output: what they added together, and the
    state of the last. Costs what they hold, once."""
    last = deltas[-1]
    if len(deltas) == 1:
        return last
    return RequestOutput(
        request_id=last.request_id,
        prompt=last.prompt,
        prompt_token_ids=last.prompt_token_ids,
        outputs=[_joined([d.outputs[i] for d in deltas]) for i in range(len(last.outputs))],
        finished=last.finished,
        num_cached_tokens=last.num_cached_tokens,
        metrics=last.metrics,
        prompt_logprobs=deltas[0].prompt_logprobs,
        pooled=last.pooled,
    )


def _joined(deltas: list[CompletionOutput]) -> CompletionOutput:
    last = deltas[-1]
    logprobs = None
    if last.logprobs is not None:
        logprobs = [logprob for d in deltas for logprob in d.logprobs or ()]
    return CompletionOutput(
        index=last.index,
        text="".join(d.text for d in deltas),
        token_ids=[token_id for d in deltas for token_id in d.token_ids],
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        logprobs=logprobs,
    )
