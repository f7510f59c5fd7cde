"""Shared fixtures for the kernel tests: every kernel variant this CPU can execute is tested, whatever it is."""

import pytest
import torch

from spyglass.kernels import cpu_isa, cpu_native

RUNNABLE_VARIANTS = [variant.name for variant in cpu_isa.runnable_variants()]


def use_variant(monkeypatch, name: str) -> None:
    """Route the module-level native kernels to variant ``name``; fail (never skip) when it did not build."""
    kernels = cpu_native.for_variant(name)
    for dtype in (torch.float32, torch.bfloat16):
        assert kernels.available(dtype), f"the {name} CPU kernels did not build (is g++ installed?)"
    monkeypatch.setattr(cpu_native, "default", lambda: kernels)


@pytest.fixture(params=RUNNABLE_VARIANTS)
def native_kernels(request, monkeypatch):
    """Each runnable variant of the compiled CPU kernels in turn (AVX2 and portable on any x86-64 host)."""
    use_variant(monkeypatch, request.param)
    return request.param


@pytest.fixture(params=[*RUNNABLE_VARIANTS, "torch"])
def cpu_kernels(request, monkeypatch):
    """Each runnable compiled variant, then the pure-torch fallback used where no compiler is found."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_native, "available", lambda dtype: False)
        monkeypatch.setattr(cpu_native, "attends", lambda dtype, cache_dtype: False)
    else:
        use_variant(monkeypatch, request.param)
    return request.param
