"""What the pooling endpoints (embeddings, score, rerank, classify) share: running one pooling
request per prompt to its answer, and the check that a prompt is pooled whole."""

from litestar import Request

from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import check_finished
from spyglass.core.api.embedding_schemas import EmbeddingUsage
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import ChoiceSpec, RequestGroup, unless_disconnected
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.sampling_params import SamplingParams


async def pool_prompts(
    serving: ServingContext,
    request: Request,
    response_id: str,
    prompts: list[tuple[list[int], str]],
    params: SamplingParams,
    attributes: dict,
    lora_name: str | None,
    images: tuple[ImageInput, ...] = (),
) -> list[RequestOutput]:
    """Each prompt's finished pooling request (ids ``{response_id}-{i}``), in order; aborted
    when the client goes away, a 500 when the engine failed one. ``images`` are a single
    prompt's (a vision model's conversation)."""
    specs = [ChoiceSpec(token_ids, params, text, images) for token_ids, text in prompts]
    group = RequestGroup(serving.async_engine, response_id, specs, attributes, lora_name)
    # A pooling request's first output is its last: starting the group runs it.
    await unless_disconnected(request, group.start())
    outputs = await unless_disconnected(request, group.final_outputs())
    for output in outputs:
        check_finished(output.outputs[0])
    return outputs


def pooled_usage(outputs: list[RequestOutput]) -> EmbeddingUsage:
    """The tokens the pooling requests read (after truncation); they generate none."""
    num_tokens = sum(len(output.prompt_token_ids) for output in outputs)
    return EmbeddingUsage(num_tokens, num_tokens)


def check_whole(
    serving: ServingContext, token_ids: list[int], truncating: bool, param: str
) -> None:
    """A 400 naming ``param`` for a prompt longer than the context, unless the request
    truncates its prompts (``truncate_prompt_tokens``): a pooled prompt is never cut silently."""
    if not truncating and len(token_ids) > serving.max_model_len:
        raise APIError(
            400,
            f"a text is longer than the model's context of {serving.max_model_len} tokens "
            "(truncate_prompt_tokens keeps its last tokens)",
            param,
        )
