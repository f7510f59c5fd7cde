"""Small per-row tensor helpers the sampler's pieces share."""

from dataclasses import replace
from typing import TypeVar

import torch

Data = TypeVar("Data")


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row's index of its largest value (the first of equals; a NaN counts as largest), as
    ``x.argmax(dim=-1)``. On the CPU numpy's vectorised argmax runs a float32 row about twenty
    times as fast as torch's (5.1 -> 0.22 ms for 64 rows of 49,152 on one core)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(x.numpy().argmax(axis=-1))
    return x.argmax(dim=-1)


def per_row(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor of per-row settings on ``device`` (`on_device`)."""
    return on_device(torch.tensor(values, dtype=dtype), device)


def to_pinned(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` (on a GPU) in pinned host memory, queued without waiting: read it
    after an event recorded behind the copy."""
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def fields_to_host(data: Data, *names: str) -> Data:
    """A copy of the dataclass ``data`` whose tensors ``names`` are copied to pinned host memory
    without waiting (`to_pinned`: read them after an event recorded behind the copies); ``data``
    itself when they are on the CPU already."""
    if getattr(data, names[0]).device.type == "cpu":
        return data
    return replace(data, **{name: to_pinned(getattr(data, name)) for name in names})


def on_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` (a CPU tensor) on ``device``, copied without waiting for the GPU's queue (a
    pageable copy would wait for the step's forward, and the host could not run ahead of it)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)
