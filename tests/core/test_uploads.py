"""A step's index arrays reach the device whole, in their shapes, each 16-byte aligned (Triton
compiles a kernel variant per pointer alignment)."""

import numpy as np
import torch

from spyglass.core.engine.runner.uploads import ALIGNMENT, upload


def test_every_array_arrives_whole_typed_and_aligned_whatever_the_sizes_before_it():
    rng = np.random.default_rng(0)
    for _ in range(40):
        shapes = [tuple(rng.integers(0, 7, size=rng.integers(1, 3))) for _ in range(5)]
        arrays = [rng.integers(-1000, 1000, size=shape) for shape in shapes]
        dtypes = [(np.int32, np.int64)[bit] for bit in rng.integers(0, 2, size=len(arrays))]
        tensors = upload(arrays, dtypes, torch.device("cpu"))
        for array, dtype, tensor in zip(arrays, dtypes, tensors):
            assert tensor.dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
            assert tuple(tensor.shape) == array.shape
            assert np.array_equal(tensor.numpy(), array.astype(dtype))
            assert tensor.data_ptr() % ALIGNMENT == 0
