"""What a new request must pass before it is queued: a free id, a prompt within the vocabulary
and the context, and a grammar some plugin can enforce."""

from collections.abc import Container

from spyglass.core.engine.plugin_manager import SafeHookRelay
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    StructuredOutput,
)
from spyglass.core.engine.token_constraint import TokenConstraint, allowed_tokens, fill_rows
from spyglass.core.tokenizer import Tokenizer


def output_room(
    req_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    in_use: Container[str],
    vocab_size: int,
    max_model_len: int,
) -> int:
    """How many tokens the request may generate; `InvalidRequestError` (naming the field) for one
    that can never run."""
    if req_id in in_use:
        raise InvalidRequestError(f"request id {req_id!r} is already in use", "request_id")
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty", "prompt")
    if max(prompt_token_ids) >= vocab_size or min(prompt_token_ids) < 0:
        raise InvalidRequestError("the prompt has token ids outside the vocabulary", "prompt")
    if params.logit_bias and not all(0 <= token < vocab_size for token in params.logit_bias):
        raise InvalidRequestError("logit_bias names token ids outside the vocabulary", "logit_bias")
    room = max_model_len - len(prompt_token_ids)
    if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
        raise InvalidRequestError(
            f"the prompt ({len(prompt_token_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
            f"the model's context of {max_model_len} tokens",
            "max_tokens",
        )
    return room


def token_constraint(
    hooks: SafeHookRelay, spec: StructuredOutput, tokenizer: Tokenizer, vocab_size: int
) -> TokenConstraint:
    """A fresh grammar matcher for ``spec`` from the plugins; `InvalidRequestError` when none can
    enforce it, or when no token of the vocabulary can start an output that matches."""
    try:
        constraint = hooks.spyglass_token_constraint(
            spec=spec, tokenizer=tokenizer, vocab_size=vocab_size
        )
    except ValueError as error:
        raise InvalidRequestError(f"invalid {spec.kind}: {error}", "response_format") from error
    if constraint is None:
        raise InvalidRequestError(
            "structured output needs a token-constraint plugin, and none is enabled",
            "response_format",
        )
    first = allowed_tokens(fill_rows([constraint], vocab_size), vocab_size)[0]
    if not any(constraint.num_valid([token]) for token in first.nonzero().flatten().tolist()[:64]):
        # e.g. a choice whose first character this vocabulary cannot spell (byte tokens are missing)
        raise InvalidRequestError(
            f"no token of this model's vocabulary can start an output matching the {spec.kind}",
            "response_format",
        )
    return constraint
