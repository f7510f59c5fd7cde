"""GGUF and HF-directory loading: weights and config equal what transformers loads; bad inputs fail clearly."""

import json

import pytest
import torch
from safetensors.torch import load_file

from spyglass.core.loaders import default_model
from spyglass.core.loaders.default_model import DEFAULT_MODEL_NAME
from spyglass.core.loaders.gguf_loader import _unpermute_rotary_rows
from spyglass.core.loaders.hf_loader import load_hf_dir
from spyglass.core.loaders.load import load_checkpoint


@pytest.fixture(scope="module")
def hf_gguf_model(default_model_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        default_model_path.parent, gguf_file=default_model_path.name, dtype=torch.float32
    )


def test_gguf_weights_equal_transformers(default_checkpoint, hf_gguf_model):
    theirs = {name: t for name, t in hf_gguf_model.state_dict().items() if name != "lm_head.weight"}
    assert default_checkpoint.weights.keys() == theirs.keys()
    for name, tensor in default_checkpoint.weights.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, theirs[name]), name


def test_gguf_arch_matches_transformers_config(default_checkpoint, hf_gguf_model):
    arch, config = default_checkpoint.arch, hf_gguf_model.config
    assert arch.architecture == "llama"
    assert (arch.vocab_size, arch.hidden_size, arch.intermediate_size) == (49152, 576, 1536)
    assert (
        arch.num_hidden_layers,
        arch.num_attention_heads,
        arch.num_key_value_heads,
        arch.head_dim,
    ) == (30, 9, 3, 64)
    assert arch.rms_norm_eps == pytest.approx(config.rms_norm_eps)
    assert arch.rope_theta == config.rope_parameters["rope_theta"] == 100000.0
    assert arch.max_position_embeddings == config.max_position_embeddings == 8192
    assert arch.tie_word_embeddings and "lm_head.weight" not in default_checkpoint.weights
    assert not arch.attention_bias and arch.rope_scaling is None
    assert (arch.bos_token_id, arch.eos_token_ids) == (1, (2,))


def test_unpermute_inverts_llama_cpp_permute():
    # llama.cpp's convert_hf_to_gguf.LlamaModel.permute, verbatim.
    def permute(weights, n_head):
        return (
            weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape)
        )

    w = torch.arange(3 * 8 * 5).reshape(3 * 8, 5).numpy()
    assert (_unpermute_rotary_rows(permute(w, 3), 3) == w).all()
    bias = torch.arange(24).numpy()
    assert (_unpermute_rotary_rows(permute(bias, 3), 3) == bias).all()
    # The permutation is not the identity, so skipping it would be caught above.
    assert not (permute(w, 3) == w).all()


def test_default_checkpoint_in_bfloat16(default_checkpoint):
    checkpoint = load_checkpoint(None, torch.bfloat16)
    assert checkpoint.name == DEFAULT_MODEL_NAME
    assert checkpoint.arch == default_checkpoint.arch
    for name, tensor in checkpoint.weights.items():
        assert torch.equal(tensor, default_checkpoint.weights[name].to(torch.bfloat16)), name


def test_tiny_llama_dir(tiny_llama_dir):
    checkpoint = load_checkpoint(str(tiny_llama_dir), torch.float32)
    saved = load_file(tiny_llama_dir / "model.safetensors")
    assert checkpoint.name == tiny_llama_dir.name
    assert checkpoint.weights.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(checkpoint.weights[name], tensor), name
    arch = checkpoint.arch
    assert arch.architecture == "llama"
    assert (arch.hidden_size, arch.intermediate_size, arch.num_hidden_layers) == (64, 128, 2)
    assert (arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim) == (4, 2, 16)
    assert arch.vocab_size == checkpoint.tokenizer.vocab_size == 49152
    assert not arch.tie_word_embeddings and not arch.attention_bias
    assert arch.rope_theta == 500000.0 and arch.max_position_embeddings == 16384
    assert arch.rope_scaling == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert (arch.bos_token_id, arch.eos_token_ids) == (1, (2,))


def test_tiny_qwen2_dir_sharded_tied_biased(tiny_qwen2_dir):
    assert len(list(tiny_qwen2_dir.glob("*.safetensors"))) > 1
    checkpoint = load_hf_dir(tiny_qwen2_dir, torch.bfloat16)
    saved = {}
    for shard in tiny_qwen2_dir.glob("*.safetensors"):
        saved.update(load_file(shard))
    saved.pop("lm_head.weight", None)
    assert checkpoint.weights.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(checkpoint.weights[name], tensor.to(torch.bfloat16)), name
    arch = checkpoint.arch
    assert arch.architecture == "qwen2" and arch.attention_bias and arch.tie_word_embeddings
    assert arch.rope_scaling is None and arch.rope_theta == 10000.0
    assert arch.eos_token_ids == checkpoint.tokenizer.eos_token_ids == (2, 0)
    assert checkpoint.weights["model.layers.1.self_attn.k_proj.bias"].abs().sum() > 0


def test_transformers4_config_spelling(tiny_llama_dir, tmp_path):
    # Hub repos saved by transformers 4 use top-level rope_theta / rope_scaling with "type".
    for item in tiny_llama_dir.iterdir():
        (tmp_path / item.name).symlink_to(item)
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = {"type": rope.pop("rope_type"), **rope}
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = load_hf_dir(tmp_path, torch.float32).arch
    assert arch.rope_theta == 500000.0 and arch.rope_scaling["rope_type"] == "llama3"
    assert arch.rope_scaling["factor"] == 8.0


def test_unsupported_architecture_is_rejected(tiny_llama_dir, tmp_path):
    for item in tiny_llama_dir.iterdir():
        (tmp_path / item.name).symlink_to(item)
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ValueError, match="Unsupported model class 'GPT2LMHeadModel'"):
        load_hf_dir(tmp_path, torch.float32)


def test_serve_lists_supported_architectures_for_an_unsupported_one(tmp_path, capsys):
    from spyglass.core.cli.main import main

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert main(["serve", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "Unsupported model class 'GPT2LMHeadModel'" in error
    for supported in (
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Gemma3ForCausalLM",
        "Qwen3MoeForCausalLM",
    ):
        assert supported in error


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("/nonexistent/model.gguf", "GGUF file not found"),
        ("/nonexistent/dir", "expected a .gguf file or a local Hugging Face model directory"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "Hub model ids are not downloaded"),
    ],
)
def test_bad_model_paths(model, message):
    with pytest.raises(ValueError, match=message):
        load_checkpoint(model, torch.float32)


def test_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_checkpoint(str(tmp_path), torch.float32)


def test_directory_without_weights(tiny_llama_dir, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).symlink_to(tiny_llama_dir / name)
    with pytest.raises(ValueError, match=r"no \*.safetensors"):
        load_hf_dir(tmp_path, torch.float32)


def test_not_a_gguf_file(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="Cannot read .* as a GGUF file"):
        load_checkpoint(str(bogus), torch.float32)


def test_default_model_download_failure_is_clear(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    # A cache dir under a regular file cannot be created: fails without touching the network.
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(RuntimeError, match="--model"):
        default_model.ensure_default_model()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "relu"}, "unsupported MLP activation 'relu'"),
        ({"mlp_bias": True}, "MLP biases"),
        (
            {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 1e4,
                    "partial_rotary_factor": 0.5,
                }
            },
            "partial rotary",
        ),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}},
            "unsupported rope scaling",
        ),
    ],
    ids=["activation", "mlp bias", "partial rotary", "dynamic rope"],
)
def test_unsupported_variants_are_rejected(tiny_llama_dir, tmp_path, change, message):
    for item in tiny_llama_dir.iterdir():
        (tmp_path / item.name).symlink_to(item)
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=message):
        load_hf_dir(tmp_path, torch.float32)


def test_the_default_model_can_be_a_local_model_named_by_the_environment(
    tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SPYGLASS_DEFAULT_MODEL", str(tiny_llama_dir))
    checkpoint = load_checkpoint(None, torch.float32)
    assert checkpoint.name == tiny_llama_dir.name
    assert checkpoint.arch == load_checkpoint(str(tiny_llama_dir), torch.float32).arch
    monkeypatch.setenv("SPYGLASS_DEFAULT_MODEL", str(tmp_path / "gone.gguf"))
    with pytest.raises(ValueError, match=r"gone\.gguf \(\$SPYGLASS_DEFAULT_MODEL\)"):
        load_checkpoint(None, torch.float32)
