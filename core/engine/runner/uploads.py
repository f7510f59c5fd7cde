"""Moving a step's host-built index arrays to the device in one copy that does not wait for the GPU."""

from collections.abc import Sequence

import numpy as np
import torch

# Triton compiles a kernel once per pointer alignment it meets (16 bytes or not): an array that
# started at an odd offset of the packed buffer compiled a second variant while serving.
ALIGNMENT = 16
_TORCH_DTYPES = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64}


def upload(
    arrays: Sequence[np.ndarray], dtypes: Sequence[type], device: torch.device
) -> list[torch.Tensor]:
    """``arrays`` as tensors on ``device``, each of its dtype in ``dtypes`` (int32 or int64) and its
    own shape, and each starting `ALIGNMENT`-byte aligned.

    They are packed into one host buffer of bytes and copied once: a step pays one pinned buffer
    and one copy, whatever its arrays' types. On a GPU the buffer is pinned and the copy
    asynchronous: a copy from pageable memory would make the host wait for every kernel queued
    before it, and one copy per array would pay that wait each time. PyTorch's pinned-memory cache
    does not hand the buffer out again before the copy has finished. On the CPU the tensors are
    views of the buffer.
    """
    types = [np.dtype(dtype) for dtype in dtypes]
    sizes = [array.size * dtype.itemsize for array, dtype in zip(arrays, types)]
    padded = [-(-size // ALIGNMENT) * ALIGNMENT for size in sizes]
    offsets = np.cumsum([0, *padded[:-1]]).tolist()
    buffer = np.zeros(sum(padded), np.uint8)
    for array, dtype, offset, size in zip(arrays, types, offsets, sizes):
        buffer[offset : offset + size].view(dtype)[:] = array.ravel()
    packed = torch.from_numpy(buffer)
    if device.type != "cpu":
        packed = packed.pin_memory().to(device, non_blocking=True)
    return [
        packed[offset : offset + size].view(_TORCH_DTYPES[dtype]).view(array.shape)
        for array, dtype, offset, size in zip(arrays, types, offsets, sizes)
    ]
