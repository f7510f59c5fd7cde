"""vLLM's ``/score`` and the Jina/Cohere-style ``/rerank`` on both server layouts: scores are the
cosine similarities of the texts' embeddings (the server's own ``/v1/embeddings`` vectors, and
transformers' within bfloat16's error), in every pairing; refusals name their field."""

import httpx
import numpy as np
import pytest
import torch

QUERY = "Where do red foxes live?"
DOCUMENTS = [
    "Red foxes live in forests, grasslands, mountains and deserts.",
    "The stock market closed higher on Tuesday.",
    "Foxes dig dens in the ground.",
    "A recipe for lemon cake with three eggs.",
]


def _post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "tiny", **body}, timeout=60)


@pytest.fixture(scope="module")
def vectors(layout_server):
    """The server's own unit embeddings of the query and the documents."""
    texts = [QUERY, *DOCUMENTS]
    data = _post(layout_server, "/v1/embeddings", input=texts, encoding_format="float").json()[
        "data"
    ]
    return {text: np.array(item["embedding"]) for text, item in zip(texts, data, strict=True)}


@pytest.fixture(scope="module")
def hf_cosine(tiny_llama_dir, tiny_server):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()

    def last_hidden(text: str) -> torch.Tensor:
        ids = httpx.post(f"{tiny_server.base_url}/tokenize", json={"prompt": text}).json()["tokens"]
        with torch.inference_mode():
            return model(torch.tensor([ids])).last_hidden_state[0, -1]

    def cosine(a: str, b: str) -> float:
        return torch.nn.functional.cosine_similarity(last_hidden(a), last_hidden(b), dim=0).item()

    return cosine


def test_one_to_many_scores_are_cosine_similarities(layout_server, vectors, hf_cosine):
    for path in ("/score", "/v1/score"):
        response = _post(layout_server, path, text_1=QUERY, text_2=DOCUMENTS).json()
        assert response["object"] == "list" and response["model"] == "tiny"
        assert [d["index"] for d in response["data"]] == [0, 1, 2, 3]
        for item, document in zip(response["data"], DOCUMENTS, strict=True):
            assert item["score"] == pytest.approx(vectors[QUERY] @ vectors[document], abs=1e-5)
            assert item["score"] == pytest.approx(hf_cosine(QUERY, document), abs=0.02)


def test_one_to_one_and_pairwise_scores(layout_server, vectors):
    single = _post(layout_server, "/score", text_1=DOCUMENTS[0], text_2=DOCUMENTS[2]).json()
    assert [d["score"] for d in single["data"]] == pytest.approx(
        [vectors[DOCUMENTS[0]] @ vectors[DOCUMENTS[2]]], abs=1e-5
    )
    pairwise = _post(layout_server, "/score", text_1=DOCUMENTS[:2], text_2=DOCUMENTS[2:]).json()
    expected = [vectors[a] @ vectors[b] for a, b in zip(DOCUMENTS[:2], DOCUMENTS[2:])]
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(expected, abs=1e-5)
    # Each distinct text is embedded once: the usage counts the query once.
    repeated = _post(layout_server, "/score", text_1=QUERY, text_2=[QUERY, QUERY]).json()
    once = _post(layout_server, "/v1/embeddings", input=QUERY).json()["usage"]["prompt_tokens"]
    assert repeated["usage"]["prompt_tokens"] == once
    assert [d["score"] for d in repeated["data"]] == pytest.approx([1.0, 1.0], abs=1e-5)


def test_rerank_orders_documents_by_relevance(layout_server, vectors):
    expected = sorted(
        range(len(DOCUMENTS)), key=lambda i: vectors[QUERY] @ vectors[DOCUMENTS[i]], reverse=True
    )
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        response = _post(layout_server, path, query=QUERY, documents=DOCUMENTS).json()
        results = response["results"]
        assert [r["index"] for r in results] == expected
        assert [r["document"]["text"] for r in results] == [DOCUMENTS[i] for i in expected]
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] == pytest.approx(
            vectors[QUERY] @ vectors[DOCUMENTS[expected[0]]], abs=1e-5
        )
        assert response["usage"]["total_tokens"] > 0
    top = _post(
        layout_server, "/rerank", query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=False
    ).json()["results"]
    assert [r["index"] for r in top] == expected[:2] and "document" not in top[0]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[:3]}, "text_1"),
        ("/score", {"text_1": "", "text_2": "x"}, "text_1"),
        ("/score", {"text_1": "a", "text_2": []}, "text_2"),
        ("/score", {"text_1": "a", "text_2": "b", "activation": False}, "activation"),
        ("/rerank", {"query": QUERY, "documents": []}, "documents"),
        ("/rerank", {"query": QUERY, "documents": [" ".join(["fox"] * 20000)]}, "documents"),
        ("/rerank", {"query": QUERY, "documents": ["a"], "top_n": -1}, "top_n"),
        ("/v1/rerank", {"documents": ["a"]}, "query"),
        (
            "/v2/rerank",
            {"query": QUERY, "documents": ["a"], "max_tokens_per_doc": 8},
            "max_tokens_per_doc",
        ),
        # More distinct texts than the queue holds (--max-queued-requests, 1024 by default).
        ("/rerank", {"query": QUERY, "documents": [f"d{i}" for i in range(1024)]}, "documents"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(layout_server, path, body, param):
    response = _post(layout_server, path, **body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_another_model_is_a_404_and_no_block_stays_held(layout_server):
    response = httpx.post(
        f"{layout_server.base_url}/rerank",
        json={"model": "other", "query": QUERY, "documents": DOCUMENTS},
        timeout=60,
    )
    assert response.status_code == 404
    kv = httpx.get(f"{layout_server.base_url}/debug/kv", timeout=10).json()
    assert kv["num_free_blocks"] == kv["num_blocks"] and kv["num_requests"] == 0
