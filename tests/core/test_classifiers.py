"""Sequence classifiers (``...ForSequenceClassification``: classifiers and reward models) load
through the real loader and give transformers' class logits at the last token: probabilities
by softmax (a sigmoid for one class), raw logits without the activation. They do not generate
(a 400 naming the model), they still embed, and other models refuse to classify."""

import pytest
import torch

from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    pooling_request_params,
)

CLASSIFIERS = [
    ("LlamaConfig", "LlamaForSequenceClassification", {"num_labels": 3}),
    ("Qwen2Config", "Qwen2ForSequenceClassification", {"id2label": {0: "neg", 1: "pos"}}),
    ("MistralConfig", "MistralForSequenceClassification", {"num_labels": 1}),  # a reward model
]


@pytest.fixture(scope="module", params=CLASSIFIERS, ids=[c[1] for c in CLASSIFIERS])
def classifier(request, tiny_pooling_model_dir):
    from transformers import AutoModelForSequenceClassification

    from spyglass.core.llm import LLM

    config_class, model_class, options = request.param
    path = tiny_pooling_model_dir(config_class, model_class, **options)
    theirs = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    ours = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    return ours, theirs


def _logits(theirs, token_ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return theirs(torch.tensor([token_ids])).logits[0].float()


def test_probabilities_and_logits_match_transformers(classifier, mixed_texts):
    ours, theirs = classifier
    labels = ours.engine.arch.labels
    assert labels == tuple(theirs.config.id2label[i] for i in range(theirs.config.num_labels))
    token_ids = [ours.get_tokenizer().encode(text) for text in mixed_texts[:4]]
    prompts = [{"prompt_token_ids": ids} for ids in token_ids]
    probs = ours.classify(prompts, use_tqdm=False)
    raw = ours.classify(prompts, use_tqdm=False, activation=False)
    for with_activation, without, ids in zip(probs, raw, token_ids, strict=True):
        expected = _logits(theirs, ids)
        torch.testing.assert_close(
            torch.tensor(without.outputs.probs), expected, atol=1e-4, rtol=1e-4
        )
        activated = expected.softmax(-1) if len(labels) > 1 else expected.sigmoid()
        torch.testing.assert_close(
            torch.tensor(with_activation.outputs.probs), activated, atol=1e-5, rtol=1e-4
        )
        assert with_activation.outputs.num_classes == len(labels)
    pool = ours.engine.kv.pool
    assert pool.num_free_blocks == pool.num_blocks


def test_a_classifier_neither_generates_nor_loses_its_embeddings(classifier):
    ours, theirs = classifier
    with pytest.raises(InvalidRequestError) as error:
        ours.generate("Hello", SamplingParams(max_tokens=4), use_tqdm=False)
    assert error.value.param == "model"
    ids = ours.get_tokenizer().encode("A fox")
    (embedded,) = ours.embed(
        {"prompt_token_ids": ids}, PoolingParams(normalize=False), use_tqdm=False
    )
    with torch.inference_mode():
        expected = theirs.model(torch.tensor([ids])).last_hidden_state[0, -1]
    torch.testing.assert_close(
        torch.tensor(embedded.outputs.embedding), expected, atol=1e-4, rtol=0
    )


def test_a_model_without_a_classifier_refuses_to_classify(make_tiny_engine):
    engine = make_tiny_engine()
    params = pooling_request_params(PoolingParams(task="classify"))
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("c", [1, 2, 3], params)
    assert error.value.param == "model"
    with pytest.raises(InvalidRequestError) as error:
        PoolingParams(task="rank")
    assert error.value.param == "task"
    cut = pooling_request_params(PoolingParams(task="classify", dimensions=8))
    with pytest.raises(InvalidRequestError) as error:
        engine.add_request("d", [1, 2, 3], cut)
    assert error.value.param == "dimensions"
