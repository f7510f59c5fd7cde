"""Converted checkpoints are cached on disk and memory-mapped by the next load; a changed file converts again."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from spyglass.core.loaders.load import load_checkpoint


def _entries(cache_root):
    return sorted(
        path.name for path in (cache_root / "converted").iterdir() if not path.name.startswith(".")
    )


@pytest.mark.parametrize(
    "model",
    [
        "tiny_qwen2_dir",
        "tiny_llava_dir",
        "tiny_llava_next_dir",
        "tiny_onevision_dir",
        "tiny_idefics3_dir",
        "tiny_qwen2_5_vl_dir",
    ],
)
def test_second_load_maps_the_cached_conversion(model, request, tmp_path, monkeypatch):
    # A vision model's architecture (its tower and preprocessing) comes back from the cache too.
    model_dir = request.getfixturevalue(model)
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    first = load_checkpoint(str(model_dir), torch.bfloat16)
    assert len(_entries(tmp_path)) == 1

    conversions = []
    monkeypatch.setattr(
        "spyglass.core.loaders.hf_loader.load_hf_dir", lambda *args: conversions.append(args)
    )
    second = load_checkpoint(str(model_dir), torch.bfloat16)
    assert conversions == [], "the second load converted again instead of reading the cache"
    assert second.name == first.name and second.arch == first.arch
    assert second.weights.keys() == first.weights.keys()
    for name, tensor in first.weights.items():
        assert second.weights[name].dtype == torch.bfloat16
        assert torch.equal(second.weights[name], tensor), name
    # Memory-mapped from the cache file, not read into fresh memory.
    cache_file = tmp_path / "converted" / _entries(tmp_path)[0] / "weights.pt"
    assert str(cache_file) in Path("/proc/self/maps").read_text()
    tokens = first.tokenizer.encode("Hello, world! <|im_start|>")
    assert second.tokenizer.encode("Hello, world! <|im_start|>") == tokens
    assert second.tokenizer.eos_token_ids == first.tokenizer.eos_token_ids
    assert second.tokenizer.chat_template == first.tokenizer.chat_template


def test_dtype_and_contents_are_part_of_the_key(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path / "cache"))
    load_checkpoint(str(tiny_llama_dir), torch.float32)
    load_checkpoint(str(tiny_llama_dir), torch.bfloat16)
    assert len(_entries(tmp_path / "cache")) == 2
    changed = shutil.copytree(tiny_llama_dir, tmp_path / "changed")
    config = (
        (changed / "config.json")
        .read_text()
        .replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05')
    )
    (changed / "config.json").write_text(config)
    assert load_checkpoint(str(changed), torch.float32).arch.rms_norm_eps == 1e-05
    assert len(_entries(tmp_path / "cache")) == 3


def test_unreadable_entry_is_converted_again(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    expected = load_checkpoint(str(tiny_llama_dir), torch.float32)
    (entry,) = _entries(tmp_path)
    (tmp_path / "converted" / entry / "weights.pt").write_bytes(b"truncated")
    again = load_checkpoint(str(tiny_llama_dir), torch.float32)
    assert all(
        torch.equal(again.weights[name], tensor) for name, tensor in expected.weights.items()
    )
    # The entry was rewritten and reads back.
    assert (
        torch.load(tmp_path / "converted" / entry / "weights.pt", weights_only=True).keys()
        == expected.weights.keys()
    )


def test_cache_can_be_turned_off(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPYGLASS_WEIGHT_CACHE", "0")
    load_checkpoint(str(tiny_llama_dir), torch.float32)
    assert not (tmp_path / "converted").exists()


def test_an_unchanged_file_is_not_hashed_again(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path))
    load_checkpoint(str(tiny_llama_dir), torch.float32)

    def read_again(*args):
        raise AssertionError("the unchanged checkpoint was hashed again")

    monkeypatch.setattr("spyglass.core.loaders.weight_cache.hashlib.file_digest", read_again)
    load_checkpoint(str(tiny_llama_dir), torch.float32)
    assert len(_entries(tmp_path)) == 1


def test_a_file_rewritten_in_place_with_its_old_size_and_time_converts_again(
    tiny_llama_dir, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPYGLASS_CACHE_DIR", str(tmp_path / "cache"))
    model = shutil.copytree(tiny_llama_dir, tmp_path / "model")
    assert load_checkpoint(str(model), torch.float32).arch.rms_norm_eps == 1e-06
    config = model / "config.json"
    before = config.stat()
    config.write_text(config.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 3e-06'))
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_size == before.st_size
    assert load_checkpoint(str(model), torch.float32).arch.rms_norm_eps == 3e-06
    assert len(_entries(tmp_path / "cache")) == 2
