"""Prompts from request bodies to token ids: checked for size and vocabulary first, tokenized off the event loop."""

import asyncio

from spyglass.core.api.context import ServingContext
from spyglass.core.api.errors import APIError

MAX_PROMPTS = 256  # prompts in one completions call


async def encode_text(
    serving: ServingContext,
    text: str,
    param: str = "prompt",
    must_fit: bool = True,
    add_special_tokens: bool = True,
) -> list[int]:
    """``text``'s token ids; a 400 before tokenizing when its bytes could not fit the context
    anyway, unless ``must_fit`` is off (the prompt is to be truncated). ``add_special_tokens``
    off leaves BOS out: a chat template's text already starts with it where the model wants it.

    Tokenizing runs in a worker thread: a few megabytes take seconds, which must not stall the server.
    """
    if must_fit and len(text.encode()) > serving.max_prompt_bytes:
        raise APIError(
            400,
            f"the prompt is too long for the model's context of {serving.max_model_len} tokens",
            param,
        )
    return await asyncio.to_thread(serving.tokenizer.encode, text, add_special_tokens)


def _is_token_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int for v in value)


def check_token_ids(
    serving: ServingContext, token_ids: list[int], param: str = "prompt"
) -> list[int]:
    """``token_ids`` when each is an id of the vocabulary; a 400 naming ``param`` otherwise."""
    # Checked as integers before anything else uses them: the tokenizer overflows on ids >= 2**32.
    if not all(0 <= t < serving.vocab_size for t in token_ids):
        raise APIError(
            400,
            f"the {param} has token ids outside the vocabulary (0 to {serving.vocab_size - 1})",
            param,
        )
    return token_ids


def count_prompts(prompt) -> int:
    """How many prompts a completions ``prompt`` field holds (before any is tokenized)."""
    return 1 if isinstance(prompt, str) or _is_token_list(prompt) else len(prompt)


async def parse_prompts(
    serving: ServingContext,
    prompt,
    must_fit: bool = True,
    param: str = "prompt",
    max_prompts: int = MAX_PROMPTS,
    add_special_tokens: bool = True,
) -> list[tuple[list[int], str]]:
    """``(token_ids, text)`` for each prompt: a string, a token list, or a non-empty list of at
    most ``max_prompts`` of either. Errors name ``param`` (the body's field); ``must_fit`` and
    ``add_special_tokens`` as `encode_text`'s."""
    if isinstance(prompt, str) or _is_token_list(prompt):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, f"{param} must not be empty", param)
    if len(prompt) > max_prompts:
        raise APIError(400, f"at most {max_prompts} prompts per request", param)
    prompts = []
    for item in prompt:
        if isinstance(item, str):
            if not item:
                raise APIError(400, f"{param} must not be empty", param)
            token_ids = await encode_text(serving, item, param, must_fit, add_special_tokens)
            prompts.append((token_ids, item))
        elif _is_token_list(item):
            token_ids = check_token_ids(serving, list(item), param)
            prompts.append(
                (token_ids, serving.tokenizer.decode(token_ids, skip_special_tokens=False))
            )
        else:
            raise APIError(
                400, f"{param} must be a string, a list of token ids, or a list of either", param
            )
    return prompts
