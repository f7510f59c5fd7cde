"""Which rows of a step's flattened batch use which LoRA adapter (`core.models.lora.LoRABatch`)."""

import itertools

import torch

from spyglass.core.engine.sched.scheduler import ScheduledRequest
from spyglass.core.models.lora import LoRAAdapter


def lora_groups(
    scheduled: tuple[ScheduledRequest, ...], device: torch.device
) -> list[tuple[LoRAAdapter, torch.Tensor | slice]]:
    """Per adapter in the step, its requests' token rows: a slice when they are one run, else an
    index tensor on ``device``. Requests without an adapter are in no group."""
    # Keyed by the adapter's load: a request may still run with an adapter unloaded since, while
    # another loaded under the same name serves newer requests.
    rows: dict[tuple[str, int], tuple[LoRAAdapter, list[range]]] = {}
    start = 0
    for s in scheduled:
        adapter = s.request.lora
        if adapter is not None:
            rows.setdefault((adapter.name, adapter.load_id), (adapter, []))[1].append(
                range(start, start + s.num_new_tokens)
            )
        start += s.num_new_tokens
    groups = []
    for adapter, ranges in rows.values():
        if all(a.stop == b.start for a, b in itertools.pairwise(ranges)):
            groups.append((adapter, slice(ranges[0].start, ranges[-1].stop)))
        else:
            index = [i for r in ranges for i in r]
            groups.append((adapter, torch.tensor(index, dtype=torch.long, device=device)))
    return groups
