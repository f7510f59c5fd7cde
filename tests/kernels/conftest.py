"""Shared fixtures for the kernel tests."""

import pytest
import torch

from spyglass.kernels import cpu_native


@pytest.fixture
def native_kernels():
    """Fail (never skip) when the compiled CPU kernels did not build: a silent fallback would test nothing."""
    for dtype in (torch.float32, torch.bfloat16):
        assert cpu_native.available(dtype), "the native CPU kernels did not build (is g++ installed?)"
