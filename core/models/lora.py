"""LoRA adapters on a loaded model: low-rank deltas added to its projections, per request.

An adapter holds, for each projection it changes, ``a [rank, in]`` and ``b [out, rank]`` with its
scale folded into ``b``, so that the projection of a token of a request using it is
``base(x) + (x @ a.T) @ b.T``. `attach_lora` wraps a model's attention and MLP projections once; a
step's `LoRABatch` then names which rows of the flattened batch use which adapter, and rows of
requests without an adapter cost nothing. Any number of adapters share one step: each adds its
delta to its own rows (two small matmuls per projection and adapter in the step).
"""

from dataclasses import dataclass, field

import torch

# The projections an adapter may change, by the name `attach_lora` gives them: fused q/k/v and
# gate/up (as the model runs them), the attention output and the MLP's down projection.
PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


@dataclass(frozen=True, slots=True)
class LoRAPair:
    """One projection's delta: ``(x @ a.T) @ b.T``, the scale already in ``b``."""

    a: torch.Tensor
    b: torch.Tensor


@dataclass(frozen=True, slots=True)
class LoRAAdapter:
    """A loaded adapter: its name, rank, where it came from, and its pairs by ``(layer, projection)``.

    ``num_parameters`` counts the weights of the adapter as saved (what PEFT counts), not of its
    fused pairs, whose ``b`` holds zeros where a part has no delta. ``load_id`` tells apart adapters
    loaded under one name at different times (an engine numbers its loads): what the prefix cache
    keys an adapter's blocks by."""

    name: str
    rank: int
    path: str
    pairs: dict[tuple[int, str], LoRAPair]
    num_parameters: int
    load_id: int = 0


@dataclass(slots=True)
class LoRABatch:
    """Which rows of the step's flattened batch use which adapter; empty outside a step's forward."""

    groups: list[tuple[LoRAAdapter, torch.Tensor | slice]] = field(default_factory=list)


class LoRALinear:
    """A projection whose rows get their request's adapter delta on top of the base output."""

    __slots__ = ("base", "batch", "key")

    def __init__(self, base, key: tuple[int, str], batch: LoRABatch):
        self.base = base
        self.key = key
        self.batch = batch

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        for adapter, rows in self.batch.groups:
            pair = adapter.pairs.get(self.key)
            if pair is None:
                continue
            if isinstance(rows, slice):  # one fused multiply-add into the rows' view
                y[rows].addmm_(x[rows] @ pair.a.T, pair.b.T)
            else:
                y.index_add_(0, rows, (x[rows] @ pair.a.T) @ pair.b.T)
        return y


def attach_lora(model) -> LoRABatch:
    """Wrap every layer's attention and dense-MLP projections of ``model`` (in place); the batch
    object the wrappers read, which the runner fills for each step.

    Sparse (mixture-of-experts) MLPs are left as they are: adapters that target them are refused
    when they load (`core.loaders.lora_loader`).
    """
    batch = LoRABatch()
    for index, layer in enumerate(model.layers):
        attention = layer.attention
        attention.qkv = LoRALinear(attention.qkv, (index, "qkv"), batch)
        attention.o_proj = LoRALinear(attention.o_proj, (index, "o_proj"), batch)
        mlp = layer.mlp
        if hasattr(mlp, "gate_up"):
            mlp.gate_up = LoRALinear(mlp.gate_up, (index, "gate_up"), batch)
            mlp.down = LoRALinear(mlp.down, (index, "down"), batch)
    return batch
