"""vLLM's ``/score`` and the Jina/Cohere-style ``/rerank``, for retrieval pipelines.

Both embed every distinct text once (as embedding requests, batched with whatever else runs)
and score a pair by the cosine similarity of the two texts' normalized embeddings, as vLLM
scores with an embedding model. Cross-encoder scoring (a classification head over the pair) is
not implemented: its fields are 400s naming them.
"""

import time

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import new_id, request_attributes
from spyglass.core.api.embedding_schemas import EmbeddingUsage
from spyglass.core.api.pooling_runs import check_whole, pool_prompts
from spyglass.core.api.prompts import encode_text
from spyglass.core.api.scoring_schemas import (
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
    ScoringFields,
)
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.pooling_params import PoolingParams, score_pairs
from spyglass.core.engine.sampling_params import pooling_request_params


@post(
    ["/score", "/v1/score"],
    summary="Score text pairs by embedding similarity",
    tags=["vllm"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": ScoreRequest},
)
async def create_score(
    data: JSONBody[ScoreRequest], request: Request, serving: NamedDependency[ServingContext]
) -> ScoreResponse:
    """``text_1`` against ``text_2``: one to one, one to many, or pairwise."""
    firsts = [data.text_1] if isinstance(data.text_1, str) else data.text_1
    seconds = [data.text_2] if isinstance(data.text_2, str) else data.text_2
    pairs = score_pairs(firsts, seconds)
    response_id = new_id("score")
    fields = {"text_1": firsts, "text_2": seconds}
    vectors, num_tokens = await _embed_texts(serving, request, data, response_id, fields)
    scores = [float(vectors[a] @ vectors[b]) for a, b in pairs]
    return ScoreResponse(
        response_id,
        int(time.time()),
        serving.response_model(data.model),
        [ScoreData(index, score) for index, score in enumerate(scores)],
        EmbeddingUsage(num_tokens, num_tokens),
    )


@post(
    ["/rerank", "/v1/rerank", "/v2/rerank"],
    summary="Rerank documents by relevance to a query",
    tags=["vllm"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": RerankRequest},
)
async def create_rerank(
    data: JSONBody[RerankRequest], request: Request, serving: NamedDependency[ServingContext]
) -> RerankResponse:
    """``documents`` most relevant to ``query`` first, the ``top_n`` of them."""
    response_id = new_id("rerank")
    fields = {"query": [data.query], "documents": data.documents}
    vectors, num_tokens = await _embed_texts(serving, request, data, response_id, fields)
    scores = [float(vectors[data.query] @ vectors[document]) for document in data.documents]
    ranked = sorted(range(len(scores)), key=lambda index: scores[index], reverse=True)
    results = [
        RerankResult(
            index,
            scores[index],
            RerankDocument(data.documents[index]) if data.return_documents else None,
        )
        for index in ranked[: data.top_n or None]
    ]
    return RerankResponse(
        response_id, serving.response_model(data.model), RerankUsage(num_tokens), results
    )


async def _embed_texts(
    serving: ServingContext,
    request: Request,
    data: ScoringFields,
    response_id: str,
    fields: dict[str, list[str]],
) -> tuple[dict[str, np.ndarray], int]:
    """The unit embedding of each distinct text of the body's ``fields`` (name -> texts), and
    the tokens embedded; a 400 naming the field of a text longer than the context (without
    ``truncate_prompt_tokens``)."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    field_of: dict[str, str] = {}
    for field, texts in fields.items():
        for text in texts:
            field_of.setdefault(text, field)
    params = pooling_request_params(
        PoolingParams(), data.truncate_prompt_tokens, data.priority, data.cache_salt
    )
    attributes = request_attributes(
        data, "embeddings", response_id, serving.model_name, request.headers
    )
    truncating = data.truncate_prompt_tokens is not None
    with serving.queue_slots(len(field_of), list(fields)[-1]):
        prompts = []
        for text, field in field_of.items():
            token_ids = await encode_text(serving, text, field, not truncating)
            check_whole(serving, token_ids, truncating, field)
            prompts.append((token_ids, text))
        outputs = await pool_prompts(
            serving, request, response_id, prompts, params, attributes, lora_name
        )
    vectors = {
        text: np.asarray(output.pooled, dtype=np.float64)
        for text, output in zip(field_of, outputs, strict=True)
    }
    return vectors, sum(len(output.prompt_token_ids) for output in outputs)
