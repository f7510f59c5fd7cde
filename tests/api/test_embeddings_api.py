"""``POST /v1/embeddings`` with the official OpenAI client and raw bodies, on both server layouts:
vectors against transformers' ``last_hidden_state``, every input form, vLLM's extras, refusals
that name their field, and a KV pool that balances afterwards."""

import math

import httpx
import openai
import pytest
import torch

from spyglass.core.tokenizer import Tokenizer
from tests.api.conftest import TINY_ARGS, start_server

TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "Embeddings put similar sentences close together",
    "x",
]


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir) -> Tokenizer:
    return Tokenizer.from_hf_dir(tiny_llama_dir)


@pytest.fixture(scope="module")
def hf_last_hidden(tiny_llama_dir):
    """transformers' float32 final-norm output at the last of ``token_ids``."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()

    def last_hidden(token_ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(torch.tensor([token_ids])).last_hidden_state[0, -1]

    return last_hidden


def _post(server, **body) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}/v1/embeddings", json={"model": "tiny", **body}, timeout=60
    )


def _cosine(a, b) -> float:
    return torch.nn.functional.cosine_similarity(
        torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), dim=0
    ).item()


def test_the_official_client_gets_transformers_vectors_in_order(
    layout_client, tokenizer, hf_last_hidden
):
    # The client asks for base64 unless told otherwise, and decodes it.
    response = layout_client.embeddings.create(model="tiny", input=TEXTS)
    assert response.object == "list" and response.model == "tiny"
    assert [d.index for d in response.data] == [0, 1, 2]
    token_ids = [tokenizer.encode(text) for text in TEXTS]
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(map(len, token_ids))
    for item, ids in zip(response.data, token_ids, strict=True):
        assert math.isclose(math.fsum(v * v for v in item.embedding), 1.0, abs_tol=1e-4)
        # bfloat16 where the CPU computes it natively, float32 elsewhere.
        assert _cosine(item.embedding, hf_last_hidden(ids)) > 0.995


def test_floats_and_base64_carry_the_same_vector(layout_client):
    as_floats = layout_client.embeddings.create(
        model="tiny", input=TEXTS[0], encoding_format="float"
    )
    as_base64 = layout_client.embeddings.create(model="tiny", input=TEXTS[0])
    assert as_floats.data[0].embedding == pytest.approx(as_base64.data[0].embedding, abs=1e-6)


def test_token_ids_embed_as_their_text_does(layout_server, tokenizer):
    ids = [tokenizer.encode(text) for text in TEXTS[:2]]
    by_text = _post(layout_server, input=TEXTS[:2], encoding_format="float").json()["data"]
    by_ids = _post(layout_server, input=ids, encoding_format="float").json()["data"]
    one = _post(layout_server, input=ids[1], encoding_format="float").json()["data"]
    for a, b in zip(by_text, by_ids, strict=True):
        assert a["embedding"] == pytest.approx(b["embedding"], abs=1e-5)
    assert one[0]["embedding"] == pytest.approx(by_text[1]["embedding"], abs=1e-5)


def test_messages_embed_the_rendered_conversation(layout_server):
    messages = [{"role": "user", "content": "Where do foxes live?"}]
    rendered = httpx.post(
        f"{layout_server.base_url}/tokenize",
        json={"messages": messages, "add_generation_prompt": False},
        timeout=60,
    ).json()["tokens"]
    chat = _post(layout_server, messages=messages, encoding_format="float").json()
    assert chat["usage"]["prompt_tokens"] == len(rendered)
    direct = _post(layout_server, input=rendered, encoding_format="float").json()
    assert chat["data"][0]["embedding"] == pytest.approx(direct["data"][0]["embedding"], abs=1e-5)


def test_unnormalized_vectors_keep_their_length(layout_server):
    raw = _post(layout_server, input=TEXTS[0], normalize=False, encoding_format="float").json()
    unit = _post(layout_server, input=TEXTS[0], encoding_format="float").json()
    vector = torch.tensor(raw["data"][0]["embedding"])
    assert vector.norm() > 1.5
    assert _cosine(vector, unit["data"][0]["embedding"]) > 0.9999


def test_truncation_embeds_the_last_tokens(layout_server, tokenizer):
    long = " ".join(["fox"] * 300)
    response = _post(
        layout_server, input=long, truncate_prompt_tokens=8, encoding_format="float"
    ).json()
    assert response["usage"]["prompt_tokens"] == 8
    tail = tokenizer.encode(long)[-8:]
    direct = _post(layout_server, input=tail, encoding_format="float").json()
    assert response["data"][0]["embedding"] == pytest.approx(
        direct["data"][0]["embedding"], abs=1e-5
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": TEXTS[0], "dimensions": 7}, "dimensions"),
        ({"input": " ".join(["fox"] * 20000)}, "input"),
        ({"input": []}, "input"),
        ({"input": [""]}, "input"),
        ({"input": [[1, 2], [1 << 20]]}, "input"),
        ({"input": TEXTS[0], "messages": [{"role": "user", "content": "hi"}]}, "input"),
        ({}, "input"),
        ({"input": TEXTS[0], "embed_dtype": "float16"}, "embed_dtype"),
        ({"input": TEXTS[0], "encoding_format": "int8"}, "encoding_format"),
        ({"input": TEXTS[0], "cache_salt": ""}, "cache_salt"),
        ({"input": TEXTS[0], "add_generation_prompt": True}, "add_generation_prompt"),
        ({"input": TEXTS[0], "chat_template_kwargs": {"x": 1}}, "chat_template_kwargs"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(layout_server, body, param):
    response = _post(layout_server, **body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_the_hidden_size_is_a_valid_dimensions_and_another_model_a_404(
    layout_server, layout_client
):
    size = len(
        _post(layout_server, input="x", encoding_format="float").json()["data"][0]["embedding"]
    )
    assert _post(layout_server, input="x", dimensions=size).status_code == 200
    with pytest.raises(openai.NotFoundError):
        layout_client.embeddings.create(model="other", input="x")


def test_embedding_beside_generation_leaves_no_block_behind(layout_server, layout_client):
    stream = layout_client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=32, stream=True
    )
    first = next(iter(stream))
    embedded = layout_client.embeddings.create(model="tiny", input=TEXTS * 4)
    assert len(embedded.data) == 12
    text = first.choices[0].text + "".join(c.choices[0].text for c in stream if c.choices)
    assert text
    kv = httpx.get(f"{layout_server.base_url}/debug/kv", timeout=10).json()
    assert kv["num_free_blocks"] == kv["num_blocks"] and kv["num_requests"] == 0


@pytest.fixture(scope="module")
def embedding_model_server(tiny_pooling_model_dir, tmp_path_factory):
    """A server on a base model (``MistralModel``: no LM head), as e5-mistral is served."""
    path = tiny_pooling_model_dir("MistralConfig", "MistralModel")
    server = start_server(str(path), tmp_path_factory.mktemp("embedding_model"), *TINY_ARGS)
    yield server
    server.stop()


def test_an_embedding_model_embeds_and_refuses_generation(embedding_model_server):
    client = openai.OpenAI(
        base_url=f"{embedding_model_server.base_url}/v1", api_key="unused", max_retries=0
    )
    embedded = client.embeddings.create(model="tiny", input=TEXTS)
    assert len(embedded.data) == 3 and len(embedded.data[0].embedding) > 0
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert error.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="tiny", prompt="hi", max_tokens=4, stream=True)
    assert error.value.body["param"] == "model"
    kv = httpx.get(f"{embedding_model_server.base_url}/debug/kv", timeout=10).json()
    assert kv["num_free_blocks"] == kv["num_blocks"] and kv["num_requests"] == 0
