"""Mean and first-token pooling (``--pooling-type``, or the checkpoint's sentence-transformers or
GGUF config) against transformers: through chunked prefill, preemption and a prefix cache that
they must not read; a mode that does not run here refuses to embed and names the option."""

import json
import shutil

import pytest
import torch

from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    pooling_request_params,
)

RAW = pooling_request_params(PoolingParams(normalize=False))


@pytest.fixture(scope="module")
def prompts(default_prompts):
    return default_prompts


@pytest.fixture(scope="module")
def hidden_states(hf_default_model, prompts):
    """transformers' final-norm output at every position of each prompt, in float32."""
    with torch.inference_mode():
        return [hf_default_model.model(torch.tensor([p])).last_hidden_state[0] for p in prompts]


POOL = {"mean": lambda states: states.mean(dim=0), "cls": lambda states: states[0]}


class LaunchesAfterPooling:
    """Counts the runner's launches made while a step with a pooling request's sum or answer is
    in flight."""

    def __init__(self, engine):
        self.count = 0
        launch = engine.runner.launch

        def counted(out, block_tables, after=None):
            pooled = None if after is None else after.pooled
            self.count += pooled is not None and bool(pooled.sums or pooled.answers)
            return launch(out, block_tables, after)

        engine.runner.launch = counted


@pytest.mark.parametrize("options", [{}, {"async_scheduling": True}], ids=["sync", "async"])
@pytest.mark.parametrize("pooling_type", ["mean", "cls"])
def test_vectors_match_transformers_through_chunks_preemption_and_the_cache(
    make_cramped_engine,
    run_engine,
    prompts,
    hidden_states,
    count_preemptions,
    pooling_type,
    options,
):
    """With async scheduling, a prompt's next chunk is launched while the chunk before it is in
    flight: its sum (not committed yet) goes into the vector too."""
    engine = make_cramped_engine(pooling_type=pooling_type, **options)
    preemptions = count_preemptions(engine)
    launches = LaunchesAfterPooling(engine)
    generate = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for _ in range(2):  # the second round's prompts are all in the cache
        # Generation first: the pooling requests, admitted last, are the ones preempted.
        _, _, *pooled = run_engine(
            engine, [prompts[2], prompts[1], *prompts], [generate] * 2 + [RAW] * 3
        )
        for output, states in zip(pooled, hidden_states, strict=True):
            assert output.num_cached_tokens == 0
            expected = POOL[pooling_type](states)
            torch.testing.assert_close(torch.tensor(output.pooled), expected, atol=2e-4, rtol=0)
    assert preemptions.req_ids, "the KV budget was meant to force preemptions"
    assert (launches.count > 0) == bool(options)
    pooling_ids = {o.request_id for o in pooled}
    assert pooling_ids & set(preemptions.req_ids), "a pooling request was meant to be preempted"


def test_classification_pools_the_last_token_whatever_the_type(tiny_pooling_model_dir):
    from transformers import AutoModelForSequenceClassification

    from spyglass.core.llm import LLM

    path = tiny_pooling_model_dir("LlamaConfig", "LlamaForSequenceClassification", num_labels=3)
    theirs = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    ours = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB",
               pooling_type="mean")  # fmt: skip
    ids = ours.get_tokenizer().encode("A fox in a forest by the sea")
    (output,) = ours.classify({"prompt_token_ids": ids}, use_tqdm=False, activation=False)
    with torch.inference_mode():
        expected = theirs(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.tensor(output.outputs.probs), expected, atol=1e-4, rtol=0)


def _with_sentence_transformers(source, destination, **modes):
    """A copy of the model directory ``source`` with a sentence-transformers Pooling module."""
    shutil.copytree(source, destination)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]  # fmt: skip
    (destination / "modules.json").write_text(json.dumps(modules))
    (destination / "1_Pooling").mkdir()
    (destination / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, **modes})
    )
    return destination


def test_a_sentence_transformers_config_chooses_the_pooling(tiny_pooling_model_dir, tmp_path):
    from transformers import AutoModel

    from spyglass.core.llm import LLM

    base = tiny_pooling_model_dir("Qwen2Config", "Qwen2Model")
    path = _with_sentence_transformers(base, tmp_path / "st", pooling_mode_mean_tokens=True)
    theirs = AutoModel.from_pretrained(base, dtype=torch.float32).eval()
    ours = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    assert ours.engine.arch.pooling_type == "mean"
    ids = ours.get_tokenizer().encode("Foxes live in forests, deserts and cities")
    (output,) = ours.embed({"prompt_token_ids": ids}, use_tqdm=False)
    with torch.inference_mode():
        expected = theirs(torch.tensor([ids])).last_hidden_state[0].mean(dim=0)
    expected = torch.nn.functional.normalize(expected, dim=-1)
    torch.testing.assert_close(torch.tensor(output.outputs.embedding), expected, atol=1e-4, rtol=0)


def test_a_mode_that_does_not_run_here_refuses_to_embed_until_overridden(
    tiny_pooling_model_dir, tmp_path
):
    from spyglass.core.llm import LLM

    base = tiny_pooling_model_dir("Qwen2Config", "Qwen2Model")
    path = _with_sentence_transformers(base, tmp_path / "st", pooling_mode_max_tokens=True)
    refusing = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB")
    with pytest.raises(InvalidRequestError, match="--pooling-type") as error:
        refusing.embed("hello", use_tqdm=False)
    assert error.value.param == "model"
    overridden = LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="64MiB",
                     pooling_type="last")  # fmt: skip
    (output,) = overridden.embed("hello", use_tqdm=False)
    assert len(output.outputs.embedding) == 64


@pytest.mark.parametrize(("written", "read"), [(None, "last"), ("MEAN", "mean"), ("CLS", "cls"),
                                               ("RANK", "rank")])  # fmt: skip
def test_a_gguf_files_pooling_type_is_read(tiny_llama_dir, gguf_from_hf, tmp_path, written, read):
    import gguf

    from spyglass.core.loaders.gguf_config import read_arch

    path = gguf_from_hf(tiny_llama_dir, "llama", tmp_path / "tiny.gguf", pooling_type=written)
    assert read_arch(gguf.GGUFReader(path)).pooling_type == read
