"""Request bodies -> engine inputs, and engine outputs -> response pieces (usage, logprobs)."""

import time
import uuid
from dataclasses import dataclass
from typing import Protocol

import msgspec
from opentelemetry import context as otel_context

from spyglass.core.api.batch_records import BATCH_ID_HEADER
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import RequestGroup
from spyglass.core.api.schemas import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    CompletionTokensDetails,
    JsonObjectResponseFormat,
    JsonSchemaResponseFormat,
    PromptLogprob,
    PromptTokensDetails,
    SamplingFields,
    StructuralTagResponseFormat,
    TokenIds,
    TopLogprob,
    Usage,
)
from spyglass.core.engine.outputs import CompletionOutput, Logprob
from spyglass.core.engine.sampling_defaults import SamplingDefaults
from spyglass.core.engine.sampling_params import (
    SamplingParams,
    StructuredOutput,
    StructuredOutputsParams,
)
from spyglass.core.tokenizer import Tokenizer

_SEED_LIMIT = 1 << 63


def new_id(prefix: str) -> str:
    """A response id such as ``cmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def sampling_params(
    body: SamplingFields,
    max_tokens: int | None,
    logprobs: int | None,
    defaults: SamplingDefaults,
) -> SamplingParams:
    """Engine `SamplingParams` from the shared request fields (ranges already checked by the
    schema), ``defaults`` for the sampling settings the body leaves out.

    Raises `InvalidRequestError` for what the schema cannot express.
    """
    if body.seed is not None and not -_SEED_LIMIT <= body.seed < _SEED_LIMIT - body.n:
        raise APIError(400, "seed must fit in a signed 64-bit integer", "seed")
    options = body.stream_options
    if options is not None and options.continuous_usage_stats and not options.include_usage:
        raise APIError(
            400,
            "stream_options.continuous_usage_stats needs stream_options.include_usage",
            "stream_options",
        )
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return SamplingParams(
        temperature=given_or(body.temperature, defaults.temperature),
        top_p=given_or(body.top_p, defaults.top_p),
        top_k=given_or(body.top_k, defaults.top_k),
        min_p=given_or(body.min_p, defaults.min_p),
        seed=body.seed,
        max_tokens=max_tokens,
        stop=[s for s in stop if s],
        ignore_eos=body.ignore_eos,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=given_or(body.repetition_penalty, defaults.repetition_penalty),
        logprobs=logprobs,
        n=body.n,
        priority=body.priority,
        cache_salt=body.cache_salt,
        structured_output=structured_output(body),
        logit_bias=_logit_bias(body.logit_bias),
        stop_token_ids=body.stop_token_ids,
        min_tokens=body.min_tokens,
        allowed_token_ids=body.allowed_token_ids,
        bad_words=body.bad_words,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
        truncate_prompt_tokens=body.truncate_prompt_tokens,
        extra={} if body.ttft_slo_s is None else {"ttft_slo_s": body.ttft_slo_s},
    )


def given_or(value, default):
    """``value`` unless the request left it out (None), else ``default``."""
    return default if value is None else value


def structured_output(body: SamplingFields) -> StructuredOutput | None:
    """The one output constraint the body asks for (``response_format`` or a vLLM ``guided_*`` field), if any."""
    asked = []
    if isinstance(body.response_format, JsonSchemaResponseFormat):
        asked.append(
            (
                "response_format",
                StructuredOutput("json_schema", body.response_format.json_schema.schema_),
            )
        )
    elif isinstance(body.response_format, JsonObjectResponseFormat):
        asked.append(("response_format", StructuredOutput("json_object")))
    elif isinstance(body.response_format, StructuralTagResponseFormat):
        tags = StructuredOutput("structural_tag", body.response_format.spec())
        asked.append(("response_format", tags))
    extras = {
        "guided_json": "json_schema",
        "guided_regex": "regex",
        "guided_choice": "choice",
        "guided_grammar": "grammar",
    }
    for field, kind in extras.items():
        value = getattr(body, field)
        if value is not None:
            asked.append((field, StructuredOutput(kind, value)))
    asked += [("structured_outputs", spec) for spec in _structured_outputs(body)]
    if len(asked) > 1:
        raise APIError(
            400,
            f"only one output constraint per request, got {', '.join(f for f, _ in asked)}",
            asked[1][0],
        )
    return asked[0][1] if asked else None


def _structured_outputs(body: SamplingFields) -> list[StructuredOutput]:
    """The constraints vLLM's ``structured_outputs`` field names (its ``json`` may be JSON text)."""
    spec = body.structured_outputs
    if spec is None:
        return []
    return StructuredOutputsParams(**msgspec.structs.asdict(spec)).constraints()


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's ``logit_bias`` (token ids as JSON object keys) with integer keys."""
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        raise APIError(
            400, "logit_bias keys must be token ids (integers as strings)", "logit_bias"
        ) from None


class CallBody(Protocol):
    """What `request_attributes` reads of any API call's body (generation's ``stream`` and ``n``
    where it has them)."""

    model: str | None
    user: str | None
    metadata: dict[str, str] | None


def request_attributes(
    body: CallBody,
    operation: str,
    response_id: str,
    model_name: str,
    headers,
) -> dict:
    """What the tracing plugin reads off each engine request (see `AsyncEngine.generate`); an
    embeddings, scoring or classification body neither streams nor has choices. The user is
    OpenAI's ``safety_identifier`` where given (it replaces ``user``), else ``user``."""
    user = getattr(body, "safety_identifier", None) or body.user
    return {
        "received_at": time.perf_counter(),  # `RequestGroup` turns it into preprocess_seconds
        "operation": operation,
        "stream": getattr(body, "stream", False),
        "user": user,
        "request_model": body.model or model_name,
        "otel_context": otel_context.get_current(),
        "tenant": headers.get("x-spyglass-tenant") or user,
        "batch_id": headers.get(BATCH_ID_HEADER),
        "prompt_cache_key": getattr(body, "prompt_cache_key", None),
        "service_tier": getattr(body, "service_tier", None),
        "api_request_id": response_id,
        "n": getattr(body, "n", 1),
        "session_id": (body.metadata or {}).get("session_id"),
        "metadata": body.metadata,
    }


def token_ids_if(asked: bool, token_ids) -> TokenIds:
    """``token_ids`` as an answer carries them with ``return_token_ids``; left out otherwise."""
    return list(token_ids) if asked else msgspec.UNSET


def make_usage(
    group: RequestGroup, n: int, reasoning_tokens: int | None = None, predicted: bool = False
) -> Usage:
    """Exact token counts of a call's choices (``n`` per prompt); each prompt counts once however
    many choices it has. ``reasoning_tokens`` (of all choices) where reasoning is split; with
    ``predicted`` (a call with a ``prediction``) its choices' drafts accepted and rejected."""
    firsts = group.latest[::n]
    prompt_tokens = sum(len(o.prompt_token_ids) for o in firsts)
    completion_tokens = sum(group.num_tokens)
    details = None
    if predicted:
        drafted = sum(o.metrics.get("num_draft_tokens", 0) for o in group.latest)
        accepted = sum(o.metrics.get("num_accepted_tokens", 0) for o in group.latest)
        details = CompletionTokensDetails(reasoning_tokens or 0, accepted, drafted - accepted)
    elif reasoning_tokens is not None:
        details = CompletionTokensDetails(reasoning_tokens)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=sum(o.num_cached_tokens for o in firsts)
        ),
        completion_tokens_details=details,
    )


def continuous_usage(body: SamplingFields) -> bool:
    """Whether every streamed chunk carries the usage so far (vLLM's ``continuous_usage_stats``)."""
    return body.stream_options is not None and body.stream_options.continuous_usage_stats


def check_finished(completion: CompletionOutput) -> None:
    """An engine-side failure of one request becomes an error (500), not a truncated answer."""
    if completion.finish_reason == "error":
        raise APIError(500, "the engine failed while generating this request", code="engine_error")


@dataclass(frozen=True, slots=True)
class TokenNames:
    """How logprobs name tokens: by their text, or (vLLM's ``return_tokens_as_token_ids``) as
    ``token_id:N``, which stays exact where a token is part of a character."""

    tokenizer: Tokenizer
    as_ids: bool = False

    def text(self, token_id: int) -> str:
        """The token's text, special tokens included."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def name(self, token_id: int) -> str:
        """What a logprobs entry calls the token."""
        return f"token_id:{token_id}" if self.as_ids else self.text(token_id)


def completion_logprobs(
    names: TokenNames,
    logprobs: list[Logprob],
    text_offset: int,
    echoed: tuple[list[int], list[Logprob | None]] | None = None,
) -> CompletionLogprobs:
    """Legacy completions logprobs for ``logprobs``, offsets counted from ``text_offset``; with
    ``echoed`` (prompt token ids and their prompt logprobs) the prompt's tokens come first, the
    first one without a logprob, as OpenAI's ``echo`` gives them."""
    result = CompletionLogprobs()
    entries: list[tuple[int, Logprob | None]] = [] if echoed is None else list(zip(*echoed))
    entries += [(entry.token_id, entry) for entry in logprobs]
    for token_id, entry in entries:
        result.tokens.append(names.name(token_id))
        result.token_logprobs.append(None if entry is None else entry.logprob)
        result.top_logprobs.append(
            None if entry is None else {names.name(t): lp for t, lp in entry.top.items()}
        )
        result.text_offset.append(text_offset)
        text_offset += len(names.text(token_id))
    return result


def prompt_logprobs(
    names: TokenNames, logprobs: list[Logprob | None] | None
) -> list[dict[str, PromptLogprob] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt token, the token's entry then its top alternatives'
    (ranked in order), keyed by token id."""
    if logprobs is None:
        return None
    result: list[dict[str, PromptLogprob] | None] = []
    for entry in logprobs:
        if entry is None:
            result.append(None)
            continue
        ranked = {
            str(token_id): PromptLogprob(value, rank, names.name(token_id))
            for rank, (token_id, value) in enumerate(entry.top.items(), start=1)
        }
        token = PromptLogprob(entry.logprob, entry.rank, names.name(entry.token_id))
        result.append({str(entry.token_id): token, **ranked})
    return result


def chat_logprobs(names: TokenNames, logprobs: list[Logprob]) -> ChatLogprobs:
    """Chat logprobs (``choices[i].logprobs.content``) for ``logprobs``; ``bytes`` are always
    those of the token's text."""
    content = []
    for entry in logprobs:
        top = [
            TopLogprob(names.name(top_id), top_logprob, list(names.text(top_id).encode()))
            for top_id, top_logprob in entry.top.items()
        ]
        content.append(
            ChatTokenLogprob(
                names.name(entry.token_id),
                entry.logprob,
                list(names.text(entry.token_id).encode()),
                top,
            )
        )
    return ChatLogprobs(content)
