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
    (written in place) and one copy, whatever its arrays' types. On a GPU the buffer is pinned and
    the copy asynchronous: a copy from pageable memory would make the host wait for every kernel
    queued before it, and one copy per array would pay that wait each time. PyTorch's
    pinned-memory cache does not hand the buffer out again before the copy has finished. On the
    CPU the tensors are views of the buffer.
    """
    types = [np.dtype(dtype) for dtype in dtypes]
    # The buffer's pieces, in order: each array's bytes, then the padding to the next alignment.
    pieces: list[int] = []
    for array, dtype in zip(arrays, types):
        size = array.size * dtype.itemsize
        pieces += (size, -size % ALIGNMENT)
    on_host = device.type == "cpu"
    packed = torch.empty(sum(pieces), dtype=torch.uint8, pin_memory=not on_host)
    buffer = packed.numpy()  # written in place: pinned already on a GPU, nothing copied twice
    offset = 0
    for array, dtype, size, padding in zip(arrays, types, pieces[::2], pieces[1::2]):
        buffer[offset : offset + size].view(dtype)[:] = array.ravel()
        offset += size + padding
    if not on_host:
        packed = packed.to(device, non_blocking=True)
    # One split for all the views, then a typed view each (and a shaped one where not flat): a
    # step pays a few host microseconds per torch call.
    typed = [
        part.view(_TORCH_DTYPES[dtype]) for part, dtype in zip(packed.split(pieces)[::2], types)
    ]
    return [
        tensor if array.ndim == 1 else tensor.view(array.shape)
        for tensor, array in zip(typed, arrays)
    ]
