"""Request and response bodies of vLLM's ``/score`` and of the Jina/Cohere-style ``/rerank``."""

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from spyglass.core.api.embedding_schemas import EmbeddingUsage
from spyglass.core.api.schemas import INT32, Metadata

Text = Annotated[str, Meta(min_length=1)]
Texts = Annotated[list[Text], Meta(min_length=1, max_length=1024)]


class ScoringFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What both scoring calls share: the model, each text's truncation, the queue priority and
    the cache salt (as for embeddings). A field that would change the scores and is not
    implemented admits only its neutral value (`unsupported`)."""

    model: str | None = None
    user: str | None = None
    metadata: Metadata | None = None
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=INT32)] | None = None
    priority: Annotated[int, Meta(ge=-INT32 - 1, le=INT32)] = 0
    cache_salt: Annotated[str, Meta(min_length=1, max_length=256)] | None = None
    # Not implemented: a cross-encoder's template and activation; scores are cosine similarities.
    chat_template: None = None
    activation: Literal[True] | None = None
    mm_processor_kwargs: None = None

    unsupported: ClassVar[frozenset[str]] = frozenset(
        {"chat_template", "activation", "mm_processor_kwargs"}
    )


class ScoreRequest(ScoringFields, kw_only=True):
    """vLLM's ``/score``: ``text_1`` against ``text_2``, one to one, one to many (``text_1`` a
    single text) or pairwise (two lists of one length)."""

    text_1: Text | Texts
    text_2: Text | Texts


class ScoreData(msgspec.Struct):
    """One pair's score: the cosine similarity of the two texts' embeddings, in [-1, 1]."""

    index: int
    score: float
    object: Literal["score"] = "score"


class ScoreResponse(msgspec.Struct):
    """The scores in the order of the pairs."""

    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: EmbeddingUsage
    object: Literal["list"] = "list"


class RerankRequest(ScoringFields, kw_only=True):
    """Jina's and Cohere's ``/rerank``, as vLLM serves it: ``documents`` ordered by their
    relevance to ``query``, the ``top_n`` first (0 or absent: all of them)."""

    query: Text
    documents: Texts
    top_n: Annotated[int, Meta(ge=0, le=INT32)] | None = None
    return_documents: bool = True
    # Cohere's, not implemented (each document is embedded whole, or cut by
    # truncate_prompt_tokens): only absent passes, else a 400 naming the field.
    max_tokens_per_doc: None = None
    max_chunks_per_doc: None = None
    rank_fields: None = None

    unsupported: ClassVar[frozenset[str]] = ScoringFields.unsupported | {
        "max_tokens_per_doc",
        "max_chunks_per_doc",
        "rank_fields",
    }


class RerankDocument(msgspec.Struct):
    """A document's text, as the request gave it."""

    text: str


class RerankResult(msgspec.Struct, omit_defaults=True):
    """A document's place in the request (``index``) and its relevance: the cosine similarity of
    its embedding and the query's."""

    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(msgspec.Struct):
    """The tokens embedded: the query once, and each document."""

    total_tokens: int


class RerankResponse(msgspec.Struct):
    """The results, most relevant first."""

    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
