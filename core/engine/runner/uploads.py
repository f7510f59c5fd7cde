"""Moving a step's host-built index arrays to the device in one copy that does not wait for the GPU."""

import numpy as np
import torch

# Triton compiles a kernel once per pointer alignment it meets (16 bytes or not): an array that
# started at an odd offset of the packed buffer compiled a second variant while serving.
ALIGNMENT = 16


def upload(arrays: list[np.ndarray], dtype: np.dtype, device: torch.device) -> list[torch.Tensor]:
    """``arrays`` as tensors of ``dtype`` on ``device``, each with its own shape and each starting
    `ALIGNMENT`-byte aligned.

    They are packed into one host buffer and copied once. On a GPU the buffer is pinned and the
    copy asynchronous: a copy from pageable memory would make the host wait for every kernel queued
    before it, and one copy per array would pay that wait each time. PyTorch's pinned-memory cache
    does not hand the buffer out again before the copy has finished. On the CPU the tensors are
    views of the buffer.
    """
    per_alignment = ALIGNMENT // np.dtype(dtype).itemsize
    padded = [-(-a.size // per_alignment) * per_alignment for a in arrays]
    offsets = np.cumsum([0, *padded[:-1]]).tolist()
    buffer = np.zeros(sum(padded), dtype)
    for array, offset in zip(arrays, offsets):
        buffer[offset : offset + array.size] = array.ravel()
    packed = torch.from_numpy(buffer)
    if device.type != "cpu":
        packed = packed.pin_memory().to(device, non_blocking=True)
    return [packed[o : o + a.size].view(a.shape) for a, o in zip(arrays, offsets)]
