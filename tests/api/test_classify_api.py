"""vLLM's ``/classify`` on a sequence classifier, on both server layouts: labels and
probabilities against transformers, raw logits without the activation, refusals that name
their field, and a generative model that refuses to classify."""

import httpx
import pytest
import torch

from tests.api.conftest import LAYOUTS, start_tiny

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
TEXTS = ["What a wonderful day", "The train was late again", "x"]


@pytest.fixture(scope="module")
def classifier_dir(tiny_pooling_model_dir):
    return tiny_pooling_model_dir("LlamaConfig", "LlamaForSequenceClassification", id2label=LABELS)


@pytest.fixture(scope="module", params=LAYOUTS)
def server(request, classifier_dir, tmp_path_factory):
    server = start_tiny(request.param, classifier_dir, tmp_path_factory.mktemp("classifier"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hf_logits(classifier_dir):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(classifier_dir, dtype=torch.float32)

    def logits(token_ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model.eval()(torch.tensor([token_ids])).logits[0]

    return logits


def _post(server, path="/classify", **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json={"model": "tiny", **body}, timeout=60)


def _token_ids(server, text: str) -> list[int]:
    return httpx.post(f"{server.base_url}/tokenize", json={"prompt": text}).json()["tokens"]


def test_labels_and_probabilities_match_transformers(server, hf_logits):
    response = _post(server, input=TEXTS).json()
    assert response["object"] == "list" and response["model"] == "tiny"
    token_ids = [_token_ids(server, text) for text in TEXTS]
    assert response["usage"]["prompt_tokens"] == sum(map(len, token_ids))
    for item, ids in zip(response["data"], token_ids, strict=True):
        expected = hf_logits(ids).softmax(-1)
        assert item["num_classes"] == 3 and item["object"] == "classification"
        # bfloat16 where the CPU computes it natively, float32 elsewhere.
        assert item["probs"] == pytest.approx(expected.tolist(), abs=0.02)
        assert sum(item["probs"]) == pytest.approx(1.0, abs=1e-5)
        assert item["label"] == LABELS[max(range(3), key=item["probs"].__getitem__)]


def test_without_the_activation_the_logits_come_back(server, hf_logits):
    for path in ("/classify", "/v1/classify"):
        response = _post(server, path, input=TEXTS[0], activation=False).json()
        (item,) = response["data"]
        expected = hf_logits(_token_ids(server, TEXTS[0]))
        assert item["probs"] == pytest.approx(expected.tolist(), abs=0.05)


def test_a_classifier_does_not_generate_but_embeds(server):
    chat = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=60,
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "model"
    embedded = _post(server, "/v1/embeddings", input="hi")
    assert embedded.status_code == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": " ".join(["fox"] * 20000)}, "input"),
        ({"input": [[1, 2], [1 << 20]]}, "input"),
        ({"input": "x", "activation": "yes"}, "activation"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(server, body, param):
    response = _post(server, **body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    kv = httpx.get(f"{server.base_url}/debug/kv", timeout=10).json()
    assert kv["num_free_blocks"] == kv["num_blocks"] and kv["num_requests"] == 0


def test_a_generative_model_refuses_to_classify(tiny_server):
    response = _post(tiny_server, input="hi")
    assert response.status_code == 400 and response.json()["error"]["param"] == "model"
