"""Requests' sampling defaults from the model's generation_config.json, as vLLM takes them
(``generation_config="auto"``): the offline API's ``generate`` without `SamplingParams` samples
as the file says; ``vllm`` ignores it; another directory's file, overrides, and refusals."""

import json
import shutil

import pytest

from spyglass.core.engine.sampling_defaults import SamplingDefaults, read_sampling_defaults
from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM

# Greedy, 5 tokens at most, a repetition penalty; top_k 50 is transformers' own default, which
# vLLM (and so Spyglass) does not take from the file.
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.0,
    "top_k": 50,
    "repetition_penalty": 1.3,
    "max_new_tokens": 5,
    "bos_token_id": 1,
}
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def model_with_defaults(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with `GENERATION_CONFIG` as its generation_config.json."""
    path = shutil.copytree(tiny_llama_dir, tmp_path_factory.mktemp("defaults") / "model")
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return path


def _llm(path, **options) -> LLM:
    return LLM(model=str(path), dtype="float32", device="cpu", kv_cache_memory="16MiB", **options)


def test_generate_without_params_samples_as_the_generation_config_says(model_with_defaults):
    llm = _llm(model_with_defaults)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 0, 5)
    assert defaults.repetition_penalty == 1.3
    [output] = llm.generate(PROMPT)
    [explicit] = llm.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=5, repetition_penalty=1.3)
    )
    assert len(output.outputs[0].token_ids) == 5
    assert output.outputs[0].token_ids == explicit.outputs[0].token_ids
    # Given params are taken as they are: 7 tokens, sampled at the API's temperature.
    [given] = llm.generate(PROMPT, SamplingParams(max_tokens=7, seed=1))
    assert len(given.outputs[0].token_ids) == 7
    [chat] = llm.chat([{"role": "user", "content": "Hi"}])
    assert len(chat.outputs[0].token_ids) == 5


def test_vllm_ignores_the_file_and_a_directory_or_overrides_give_their_own(
    model_with_defaults, tiny_llama_dir
):
    plain = _llm(model_with_defaults, generation_config="vllm").get_default_sampling_params()
    assert plain.temperature == 1.0 and plain.max_tokens == 16
    elsewhere = _llm(tiny_llama_dir, generation_config=str(model_with_defaults))
    assert elsewhere.get_default_sampling_params().max_tokens == 5
    overridden = read_sampling_defaults(
        "auto", str(model_with_defaults), {"temperature": 0.7, "top_p": 0.8}
    )
    assert (overridden.temperature, overridden.top_p, overridden.max_tokens) == (0.7, 0.8, 5)
    assert overridden.source == (
        "the model's generation_config.json and --override-generation-config"
    )


def test_models_without_a_generation_config_keep_the_apis_defaults(tiny_llama_dir, tmp_path):
    assert read_sampling_defaults("auto", str(tiny_llama_dir)).changed() == {}
    assert read_sampling_defaults("auto", None) == SamplingDefaults(
        source="the model's generation_config.json"
    )
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert read_sampling_defaults("auto", str(gguf)).changed() == {}


@pytest.mark.parametrize(
    ("source", "config", "overrides", "says"),
    [
        ("auto", {"temperature": -1.0}, {}, "temperature must be >= 0"),
        ("auto", {"top_p": 2}, {}, r"top_p must be in \(0, 1\]"),
        ("auto", {}, {"do_sample": True}, r"\['do_sample'\]: the generation config keys"),
        ("elsewhere", {}, {}, "does not exist"),
    ],
)
def test_defaults_that_cannot_hold_stop_the_start(tmp_path, source, config, overrides, says):
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    where = str(tmp_path / "nowhere") if source == "elsewhere" else "auto"
    with pytest.raises(ValueError, match=says):
        read_sampling_defaults(where, str(tmp_path), overrides)
