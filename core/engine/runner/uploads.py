"""Moving a step's host-built index arrays to the device in one copy that does not wait for the GPU."""

import numpy as np
import torch


def upload(arrays: list[np.ndarray], dtype: np.dtype, device: torch.device) -> list[torch.Tensor]:
    """``arrays`` as tensors of ``dtype`` on ``device``, each with its own shape.

    They are packed into one host buffer and copied once. On a GPU the buffer is pinned and the
    copy asynchronous: a copy from pageable memory would make the host wait for every kernel queued
    before it, and one copy per array would pay that wait each time. PyTorch's pinned-memory cache
    does not hand the buffer out again before the copy has finished. On the CPU the tensors are
    views of the buffer.
    """
    packed = torch.from_numpy(np.concatenate([a.ravel() for a in arrays]).astype(dtype, copy=False))
    if device.type != "cpu":
        packed = packed.pin_memory().to(device, non_blocking=True)
    parts = packed.split([a.size for a in arrays])
    return [part.view(a.shape) for part, a in zip(parts, arrays)]
