"""Instruction-set detection and kernel variants: every variant compiles on any host, defaults follow the CPU."""

import subprocess

import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.kernels import cpu_isa, native_build

AVX2_EPYC = frozenset(["sse4_2", "ssse3", "popcnt", "avx", "avx2", "fma", "f16c", "bmi2", "movbe"])
AVX512_BF16_EPYC = AVX2_EPYC | frozenset(
    ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16", "avx512_vnni"]
)
AMX_XEON = AVX512_BF16_EPYC | frozenset({"amx_bf16", "amx_tile"})


@pytest.mark.parametrize("variant", cpu_isa.kernel_variants(), ids=lambda v: v.name)
@pytest.mark.parametrize("library", ["paged_attention", "layer_ops", "quant_matmul"])
def test_every_variant_compiles_whatever_the_host(variant, library):
    # Built, not run: a variant this CPU cannot execute must still compile, so an AVX-512 CI host
    # catches a broken AVX2 build and the other way round.
    try:
        path = native_build.library_path(library, variant)
    except subprocess.CalledProcessError as error:
        pytest.fail(f"{library} does not compile for {variant.name}: {error.stderr}")
    assert path.stat().st_size > 0


@pytest.mark.parametrize(
    "flags, best, bf16, prepack",
    [
        (AVX2_EPYC, "avx2", False, False),
        (AVX512_BF16_EPYC, "avx512-bf16", True, True),
        (AMX_XEON, "avx512-bf16", True, True),
        (AVX2_EPYC | {"avx_ne_convert"}, "avx2", True, True),
        (frozenset({"sse4_2", "ssse3", "popcnt"}), "portable", False, False),
        (frozenset(), "portable", False, False),
    ],
)
def test_variant_and_bf16_decisions_follow_the_flags(flags, best, bf16, prepack):
    if not cpu_isa.is_x86_64():
        pytest.skip("the x86-64 variants apply to x86-64 hosts")
    assert cpu_isa.best_variant(flags).name == best
    assert cpu_isa.has_native_bf16(flags) is bf16
    assert cpu_isa.can_prepack_bf16(flags) is prepack


def test_host_runs_its_best_variant_and_the_portable_one():
    names = [variant.name for variant in cpu_isa.runnable_variants()]
    assert names[-1] == "portable"
    assert names[0] == cpu_isa.best_variant().name


def test_auto_dtype_is_bf16_only_with_native_bf16(monkeypatch):
    config = EngineConfig(device="cpu")
    monkeypatch.setattr(cpu_isa, "has_native_bf16", lambda flags=None: False)
    assert config.dtype_choice() == (torch.float32, "auto: the CPU has no native bf16")
    monkeypatch.setattr(cpu_isa, "has_native_bf16", lambda flags=None: True)
    assert config.dtype_choice()[0] == torch.bfloat16
    assert EngineConfig(device="cpu", dtype="float32").dtype_choice() == (
        torch.float32,
        "asked for",
    )
