"""Per-request generation settings, with vLLM's names and defaults."""

import enum
import json
import math
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spyglass.core.engine.pooling_params import PoolingParams

STRUCTURED_OUTPUT_KINDS = (
    "json_schema",
    "json_object",
    "regex",
    "choice",
    "grammar",
    "structural_tag",
)
FREE_TEXT_KINDS = ("grammar", "structural_tag")
"""Kinds that hold from the answer's first token, never after a thought: a grammar names its own
start, and structural tags allow any text (a thought's too) but the structures they open."""


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """A constraint on a request's output text.

    ``kind`` is one of `STRUCTURED_OUTPUT_KINDS`; ``value`` is the JSON schema (a dict) for
    ``json_schema``, None for ``json_object``, the pattern for ``regex``, the list of strings for
    ``choice``, the grammar text (Lark or GBNF) for ``grammar``, and for ``structural_tag``
    (vLLM's) ``{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}``: any text,
    but each trigger it writes opens a structure whose ``begin`` starts with it, then JSON
    obeying its ``schema``, then its ``end``.

    ``after_reasoning`` (not with `FREE_TEXT_KINDS`) lets the answer reason first, unconstrained: Lark
    rules defining ``reasoning``, the text the answer may open with before the constraint holds
    (a reasoning format's, `ReasoningParser.reasoning_rules`), as vLLM applies structured outputs
    after a reasoning model's thinking.
    """

    kind: str
    value: object = None
    after_reasoning: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_OUTPUT_KINDS:
            raise ValueError(
                f"structured output kind must be one of {STRUCTURED_OUTPUT_KINDS}, got {self.kind!r}"
            )
        if self.kind in FREE_TEXT_KINDS and self.after_reasoning is not None:
            raise ValueError(f"a {self.kind} cannot follow reasoning: it holds from the start")


class RequestOutputKind(enum.Enum):
    """What each of a request's outputs holds, as vLLM's kinds: the whole text and tokens so far
    (CUMULATIVE), only what they gained since the previous output (DELTA), or one output at the end
    (FINAL_ONLY); and FIRST_AND_FINAL, two deltas: the first token's, then the rest at the end.

    A cumulative output copies the request's token list at every step, which grows with its
    length; streaming servers ask for deltas and offline callers for the final output only. A
    non-streamed HTTP call asks for the first and the final: the first says its request started
    (the server's queue holds its place until then), and no output is built, sent or joined for
    the tokens between."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2
    FIRST_AND_FINAL = 3

    @property
    def is_delta(self) -> bool:
        """Whether each output holds only what the request gained since its previous one."""
        return self in (RequestOutputKind.DELTA, RequestOutputKind.FIRST_AND_FINAL)


# Temperatures below this sample greedily (as vLLM's _SAMPLING_EPS): dividing logits by 1e-40 gives inf and NaN.
GREEDY_TEMPERATURE = 1e-5
MAX_TOP_K = (
    1 << 31
) - 1  # the sampler builds int64 tensors of these; anything above is "the whole vocabulary"


MAX_LOGPROBS = 20  # the most alternatives a token's logprobs list (vLLM's default max_logprobs)


class InvalidRequestError(ValueError):
    """A request's parameters are out of range; the HTTP API answers it with a 400."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """vLLM's spelling of an output constraint (``SamplingParams(structured_outputs=...)``, and
    the HTTP API's ``structured_outputs`` field): one of ``json`` (a schema, or its JSON text),
    ``regex``, ``choice``, ``grammar``, ``json_object`` or ``structural_tag`` (its spec, or its
    JSON text, as vLLM takes it)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: dict | str | None = None

    def constraints(self) -> list[StructuredOutput]:
        """Each constraint these name, as `StructuredOutput`s (the caller refuses more than one);
        `InvalidRequestError` for ``json`` text that is not JSON."""
        asked = []
        if self.json is not None:
            asked.append(StructuredOutput("json_schema", _json_value(self.json, "json")))
        for kind in ("regex", "choice", "grammar"):
            if getattr(self, kind) is not None:
                asked.append(StructuredOutput(kind, getattr(self, kind)))
        if self.json_object:
            asked.append(StructuredOutput("json_object"))
        if self.structural_tag is not None:
            tags = _json_value(self.structural_tag, "structural_tag")
            asked.append(StructuredOutput("structural_tag", tags))
        return asked


def _json_value(value: dict | str, name: str) -> object:
    """``value``, parsed where it is JSON text; `InvalidRequestError` for text that is not JSON."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as error:
        raise InvalidRequestError(
            f"structured_outputs.{name} is not JSON: {error}", "structured_outputs"
        ) from None


@dataclass(slots=True)
class SamplingParams:
    """How to sample one completion; ``temperature`` below `GREEDY_TEMPERATURE` (0 included) means greedy.

    ``speculative=False`` opts this request out of speculative decoding; ``priority`` (lower runs
    first) is read by the priority scheduling policy. ``structured_output`` constrains the output
    (a plugin on ``spyglass_token_constraint`` enforces it); ``logit_bias`` maps token ids to values
    in [-100, 100] added to their logits before sampling, as OpenAI's parameter does.
    ``output_kind`` says what each output holds (`RequestOutputKind`).

    vLLM's extras: ``min_tokens`` holds off EOS, stop tokens and stop strings until that many
    tokens are out; ``allowed_token_ids`` limits sampling to those ids; ``bad_words`` are never
    generated (each word's tokens, with and without a leading space: the last token of a word is
    banned after the others); ``include_stop_str_in_output`` keeps a matched stop string in the
    text; ``skip_special_tokens=False`` keeps special tokens' text; ``truncate_prompt_tokens``
    keeps only the prompt's last that many tokens (-1: the model's context).
    ``prompt_logprobs`` asks for the logprob of every prompt token after the first (and that
    many top alternatives): the request's whole prompt is then computed, none of it taken from
    the prefix cache. ``cache_salt`` (vLLM's) keeps the request's prefix-cache blocks apart from
    those of requests with another salt or none: tenants who do not share a salt cannot learn
    from a cache hit's speed what another one's prompts hold. With ``pooling`` the request is
    an embedding request (`pooling_request_params`): its output is its prompt's embedding, not text.
    ``prediction`` (OpenAI's predicted outputs) is token ids the output is expected to mostly
    repeat: with n-gram speculation (``--speculative ngram``) drafts are looked up there first.
    The output is the same with or without it; only the steps it takes change.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 1
    priority: int = 0
    speculative: bool = True
    structured_output: StructuredOutput | None = None
    logit_bias: dict[int, float] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    min_tokens: int = 0
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    cache_salt: str | None = None
    pooling: "PoolingParams | None" = None
    prediction: list[int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # vLLM's spelling of ``structured_output``: turned into it here, not kept.
    structured_outputs: InitVar[StructuredOutputsParams | None] = None

    def __post_init__(self, structured_outputs: StructuredOutputsParams | None) -> None:
        if structured_outputs is not None:
            asked = structured_outputs.constraints()
            if len(asked) != 1 or self.structured_output is not None:
                raise InvalidRequestError(
                    "structured_outputs must name exactly one constraint (json, regex, choice, "
                    "grammar or json_object), and not beside structured_output",
                    "structured_outputs",
                )
            self.structured_output = asked[0]
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = list(self.allowed_token_ids)
        if self.prediction is not None:
            self.prediction = list(self.prediction)
        if self.top_k is None or self.top_k == -1:
            self.top_k = 0
        self.validate()

    def validate(self) -> None:
        """Raise `InvalidRequestError` naming the first parameter that is out of range."""
        checks = [
            (
                math.isfinite(self.temperature) and self.temperature >= 0,
                "temperature",
                "temperature must be >= 0",
            ),
            (
                0 <= self.top_k <= MAX_TOP_K,
                "top_k",
                f"top_k must be -1 (off) or in [0, {MAX_TOP_K}]",
            ),
            (0 < self.top_p <= 1, "top_p", "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p", "min_p must be in [0, 1]"),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                "max_tokens",
                "max_tokens must be at least 1",
            ),
            (
                -2 <= self.presence_penalty <= 2,
                "presence_penalty",
                "presence_penalty must be in [-2, 2]",
            ),
            (
                -2 <= self.frequency_penalty <= 2,
                "frequency_penalty",
                "frequency_penalty must be in [-2, 2]",
            ),
            (self.repetition_penalty > 0, "repetition_penalty", "repetition_penalty must be > 0"),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                "logprobs",
                f"logprobs must be in [0, {MAX_LOGPROBS}]",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "prompt_logprobs",
                "prompt_logprobs must be in [0, 20]",
            ),
            (self.n >= 1, "n", "n must be at least 1"),
            (all(self.stop or ()), "stop", "stop strings must not be empty"),
            (
                0 <= self.min_tokens <= (self.max_tokens or self.min_tokens),
                "min_tokens",
                "min_tokens must be in [0, max_tokens]",
            ),
            (
                self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
                "allowed_token_ids",
                "allowed_token_ids must not be empty",
            ),
            (
                self.prediction is None or len(self.prediction) > 0,
                "prediction",
                "prediction must not be empty",
            ),
            (
                all(w.strip() for w in self.bad_words or ()),
                "bad_words",
                "bad words must not be blank",
            ),
            (
                self.truncate_prompt_tokens is None
                or self.truncate_prompt_tokens == -1
                or self.truncate_prompt_tokens >= 1,
                "truncate_prompt_tokens",
                "truncate_prompt_tokens must be -1 (the model's context) or at least 1",
            ),
            (
                all(-100 <= bias <= 100 for bias in (self.logit_bias or {}).values()),
                "logit_bias",
                "logit_bias values must be in [-100, 100]",
            ),
        ]
        for ok, param, message in checks:
            if not ok:
                raise InvalidRequestError(message, param)

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        """True when any presence, frequency or repetition penalty applies."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )


def pooling_request_params(
    pooling: "PoolingParams",
    truncate_prompt_tokens: int | None = None,
    priority: int = 0,
    cache_salt: str | None = None,
) -> SamplingParams:
    """The settings of a pooling request (its prompt's embedding or classes, as ``pooling``
    says): one greedy step that samples nothing the output keeps, no drafts, and one output at
    the end."""
    return SamplingParams(
        temperature=0.0,
        max_tokens=1,
        speculative=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
        truncate_prompt_tokens=truncate_prompt_tokens,
        priority=priority,
        cache_salt=cache_salt,
        pooling=pooling,
    )
