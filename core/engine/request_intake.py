"""What a new request must pass before it is queued: a free id, a prompt and token ids within
the vocabulary and the context, and a grammar some plugin can enforce; its bad words' tokens."""

from collections.abc import Container

from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.image_layout import checked_layout
from spyglass.core.engine.plugin_manager import SafeHookRelay
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    StructuredOutput,
)
from spyglass.core.engine.token_constraint import TokenConstraint, allowed_tokens, fill_rows
from spyglass.core.models.model_config import POOLING_TYPES, ModelArchConfig
from spyglass.core.models.vision_config import VisionConfig
from spyglass.core.tokenizer import Tokenizer


def truncated_prompt(
    prompt_token_ids: list[int],
    prompt: str | None,
    params: SamplingParams,
    max_model_len: int,
    tokenizer: Tokenizer,
) -> tuple[list[int], str | None]:
    """The prompt's ids and text after ``params.truncate_prompt_tokens`` (-1: the context): its
    last that many tokens, and their text when it had one. Truncating twice changes nothing."""
    keep = max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
    if keep is None or len(prompt_token_ids) <= keep:
        return prompt_token_ids, prompt
    kept = prompt_token_ids[-keep:]
    return kept, None if prompt is None else tokenizer.decode(kept, skip_special_tokens=False)


def check_images(
    prompt_token_ids: list[int],
    images: tuple[ImageInput, ...],
    vision: VisionConfig | None,
    params: SamplingParams,
    max_model_len: int,
    limits: dict[str, int] | None = None,
) -> None:
    """`InvalidRequestError` naming ``multi_modal_data`` for images given to a model that reads
    none, for a vision model's prompt that holds image (or video) placeholders with none to fill
    them, for an image or video that does not fill its placeholders or has other pixels than the
    tower's, for more images or videos than ``limits`` allows (``--limit-mm-per-prompt``), and
    for a truncation that would cut through a prompt with images."""
    if vision is None:
        if images:
            raise InvalidRequestError(
                "this model reads no images (serve a vision model, e.g. LLaVA, for images)",
                "multi_modal_data",
            )
        return
    for kind, token in (("image", vision.image_token_id), ("video", vision.video_token_id)):
        count = sum((image.clip is not None) == (kind == "video") for image in images)
        if not count and token is not None and token in prompt_token_ids:
            raise InvalidRequestError(
                f"the prompt holds {kind} placeholder tokens but no {kind}s", "multi_modal_data"
            )
        limit = (limits or {}).get(kind)
        if limit is not None and count > limit:
            raise InvalidRequestError(
                f"a prompt may hold at most {limit} {kind}s (--limit-mm-per-prompt)",
                "multi_modal_data",
            )
    if not images:
        return
    alone = sum(image.clip is None for image in images) == 1
    for image in images:
        layout = checked_layout(vision, *image.size, alone, "multi_modal_data", image.clip)
        token = vision.image_token_id if image.clip is None else vision.video_token_id
        if (
            image.offset < 0
            or image.runs != layout.runs
            or image.length != len(layout.token_ids)
            or tuple(image.pixel_values.shape) != layout.pixel_shape
            or any(
                prompt_token_ids[start:end] != [token] * (end - start)
                for start, end, _ in image.embedding_runs()
            )
        ):
            # Only a caller that placed images by hand gets here (`place_images` places them right).
            raise InvalidRequestError(
                f"an image must fill its placeholder tokens of the prompt as its size lays them "
                f"out and hold pixels of shape {list(layout.pixel_shape)}",
                "multi_modal_data",
            )
    keep = max_model_len if params.truncate_prompt_tokens == -1 else params.truncate_prompt_tokens
    if keep is not None and len(prompt_token_ids) > keep:
        raise InvalidRequestError(
            "truncate_prompt_tokens would cut a prompt with images", "truncate_prompt_tokens"
        )


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
    for field in ("logit_bias", "allowed_token_ids", "stop_token_ids", "prediction"):
        if not all(0 <= token < vocab_size for token in getattr(params, field) or ()):
            raise InvalidRequestError(f"{field} names token ids outside the vocabulary", field)
    room = max_model_len - len(prompt_token_ids)
    if params.pooling is not None:  # an embedding computes the prompt and generates nothing
        if room < 0:
            raise InvalidRequestError(
                f"the prompt ({len(prompt_token_ids)} tokens) exceeds the model's context of "
                f"{max_model_len} tokens",
                "prompt",
            )
        return 1
    if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
        raise InvalidRequestError(
            f"the prompt ({len(prompt_token_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
            f"the model's context of {max_model_len} tokens",
            "max_tokens",
        )
    return room


def pool_range(
    params: SamplingParams, pooling_type: str, num_prompt_tokens: int
) -> tuple[int, int] | None:
    """The prompt positions ``[first, last)`` whose final hidden states a pooling request pools:
    the last one (``last``, and every classification: classifiers read the last token), all of
    them (``mean``) or the first (``cls``); None for a request that generates."""
    pooling = params.pooling
    if pooling is None:
        return None
    if pooling.task == "classify" or pooling_type == "last":
        return num_prompt_tokens - 1, num_prompt_tokens
    return (0, 1) if pooling_type == "cls" else (0, num_prompt_tokens)


def check_pooling(
    params: SamplingParams, arch: ModelArchConfig, pooling_type: str, tensor_parallel_size: int
) -> None:
    """`InvalidRequestError` for a request this engine cannot answer: generation on a model
    without an LM head, classification on one without a classifier's, an embedding by a
    ``pooling_type`` that does not run here (a checkpoint's, without ``--pooling-type``) or of
    other ``dimensions`` than the model's hidden size, or any pooling under tensor parallelism
    (the workers run the forward to the logits only)."""
    pooling = params.pooling
    if pooling is None:
        if not arch.has_lm_head:
            kind = "a classifier" if arch.num_labels else "an embedding model (no LM head)"
            raise InvalidRequestError(f"this model is {kind}: it does not generate text", "model")
        return
    if pooling.task == "classify" and pooling.dimensions is not None:
        raise InvalidRequestError("dimensions applies to embeddings, not classes", "dimensions")
    if pooling.task == "classify" and not arch.num_labels:
        raise InvalidRequestError(
            "this model has no classification head (serve a ...ForSequenceClassification "
            "checkpoint to classify)",
            "model",
        )
    if pooling.task == "embed" and pooling_type not in POOLING_TYPES:
        raise InvalidRequestError(
            f"this model's checkpoint pools embeddings by {pooling_type!r}, which Spyglass does "
            f"not run; start it with --pooling-type (one of {', '.join(POOLING_TYPES)}) to embed",
            "model",
        )
    if tensor_parallel_size > 1:
        raise InvalidRequestError(
            "embeddings are not served with tensor parallelism", "tensor_parallel_size"
        )
    check_dimensions(pooling.dimensions, arch)


def check_dimensions(dimensions: int | None, arch: ModelArchConfig) -> None:
    """`InvalidRequestError` for an embedding length the model was not trained to give: its
    hidden size always is; a shorter one only for a Matryoshka-trained model (one it lists, or
    any when it lists none)."""
    hidden_size, allowed = arch.hidden_size, arch.matryoshka_dimensions
    if dimensions is None or dimensions == hidden_size:
        return
    if not allowed:
        raise InvalidRequestError(
            f"dimensions must be the model's hidden size ({hidden_size}): it is not trained "
            "for shorter embeddings (Matryoshka)",
            "dimensions",
        )
    if dimensions > hidden_size or (allowed != (0,) and dimensions not in allowed):
        sizes = f"at most {hidden_size}" if allowed == (0,) else f"one of {list(allowed)}"
        raise InvalidRequestError(f"dimensions must be {sizes}", "dimensions")


def check_prediction(params: SamplingParams, speculative: str | None) -> None:
    """`InvalidRequestError` naming ``prediction`` where it would change nothing: only n-gram
    speculation reads it, and requests with logprobs or penalties, or that opted out of
    speculation, get no drafts."""
    if params.prediction is None:
        return
    if speculative != "ngram":
        raise InvalidRequestError(
            "prediction needs a server running n-gram speculation (--speculative ngram); this "
            f"one runs {speculative or 'none'}",
            "prediction",
        )
    if params.logprobs is not None or params.has_penalties or not params.speculative:
        raise InvalidRequestError(
            "prediction does not combine with logprobs, penalties or speculative=false: such "
            "requests get no drafts",
            "prediction",
        )


def check_min_tokens(params: SamplingParams, eos_token_ids: tuple[int, ...]) -> None:
    """`InvalidRequestError` when ``min_tokens`` would hold off every allowed token."""
    stops = {*eos_token_ids, *(params.stop_token_ids or ())}
    if (
        params.min_tokens
        and params.allowed_token_ids
        and stops.issuperset(params.allowed_token_ids)
    ):
        raise InvalidRequestError(
            "allowed_token_ids holds only stop tokens, which min_tokens holds off", "min_tokens"
        )


def token_constraint(
    hooks: SafeHookRelay,
    spec: StructuredOutput,
    tokenizer: Tokenizer,
    vocab_size: int,
    allowed_token_ids: list[int] | None = None,
) -> TokenConstraint:
    """A fresh grammar matcher for ``spec`` from the plugins; `InvalidRequestError` when none can
    enforce it, or when no token of the vocabulary (of ``allowed_token_ids``, when given) can
    start an output that matches."""
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
    if allowed_token_ids is not None and not first[allowed_token_ids].any():
        raise InvalidRequestError(
            f"none of allowed_token_ids can start an output matching the {spec.kind}",
            "allowed_token_ids",
        )
    return constraint


def bad_word_token_ids(tokenizer: Tokenizer, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """Each bad word's token ids as it starts the text and, where that spells it differently, as
    it follows a space (mid-sentence words usually carry the space in their first token)."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        sequences += [bare] if spaced == bare else [bare, spaced]
    return tuple(sequences)
