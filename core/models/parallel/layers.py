"""One rank's Llama-style model: its shard of the weights, with the collectives that make the ranks one model.

Per block there is one all-reduce after attention (the row-parallel ``o_proj``) and one after the
MLP (the row-parallel ``down``); the embedding is vocab-parallel (each rank looks up the ids in its
rows, zeros elsewhere, then an all-reduce) and so is the LM head (each rank scores its rows of the
vocabulary, then an all-gather). Every rank runs the same forward; rank 0 samples from the logits.
"""

from typing import Protocol

import torch

from spyglass.core.models.llama import LlamaForCausalLM
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.parallel.shard import RankShard, rank_arch, shard_weights
from spyglass.core.models.quantization import lookup_rows
from spyglass.kernels.backend import AttentionBackend


class Collectives(Protocol):
    """The collectives a rank's model calls; every rank calls them in the same order."""

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks in place; returns it."""
        ...

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (all the same shape), in rank order."""
        ...


class RowParallelLinear:
    """A linear over this rank's slice of the input features whose partial outputs are summed across ranks."""

    __slots__ = ("comm", "inner")

    def __init__(self, inner, comm: Collectives):
        self.inner = inner
        self.comm = comm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_reduce_(self.inner(x))


class VocabParallelLMHead:
    """Logits for this rank's vocabulary rows, gathered into the whole vocabulary's logits on every rank."""

    __slots__ = ("comm", "inner", "shard", "vocab_size")

    def __init__(self, inner, comm: Collectives, shard: RankShard, vocab_size: int):
        self.inner = inner
        self.comm = comm
        self.shard = shard
        self.vocab_size = vocab_size

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        local = self.inner(x)
        pad = self.shard.vocab_chunk - local.shape[-1]
        if pad:
            local = torch.nn.functional.pad(local, (0, pad))
        return torch.cat(self.comm.all_gather(local.contiguous()), dim=-1)[:, : self.vocab_size]


class TensorParallelLlama(LlamaForCausalLM):
    """`LlamaForCausalLM` over one rank's shard (see `shard_weights`); ``arch`` is the rank's (its heads)."""

    def __init__(
        self,
        arch: ModelArchConfig,
        shard: RankShard,
        weights: dict,
        backend: AttentionBackend,
        device,
        comm: Collectives,
    ):
        """``weights`` are this rank's shard already (`shard_weights`), ``arch`` the whole model's."""
        super().__init__(rank_arch(arch, shard), weights, backend, device)
        self.shard = shard
        self.comm = comm
        for layer in self.layers:
            layer.attention.o_proj = RowParallelLinear(layer.attention.o_proj, comm)
            layer.mlp.down = RowParallelLinear(layer.mlp.down, comm)
        self.lm_head = VocabParallelLMHead(self.lm_head, comm, shard, arch.vocab_size)

    @classmethod
    def from_full_weights(
        cls, arch: ModelArchConfig, shard: RankShard, weights: dict, backend, device, comm
    ):
        """The rank's model from the whole checkpoint's weights (sharded here)."""
        return cls(arch, shard, shard_weights(weights, arch, shard), backend, device, comm)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocab-parallel lookup: this rank's rows for the ids it holds, zeros for the rest, summed over ranks."""
        vocab = self.shard.vocab
        mine = (input_ids >= vocab.start) & (input_ids < vocab.stop)
        local_ids = torch.where(mine, input_ids - vocab.start, 0)
        rows = lookup_rows(self.embed, local_ids, self.dtype)
        rows = rows * mine.unsqueeze(-1).to(rows.dtype)
        return self.comm.all_reduce_(rows)
