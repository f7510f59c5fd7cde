"""Constrained decoding's seam: what a request asks for, and the matcher a plugin returns for it.

A request's `StructuredOutput` (JSON schema, any JSON object, regex, choice or grammar) is turned
into a `TokenConstraint` by the ``spyglass_token_constraint`` hook when the request is added. Each
step the engine asks every constrained request's matcher which tokens may come next, as one
bitmask for the batch (bit ``j`` of word ``i`` allows token ``32 * i + j``, the layout xgrammar and
llguidance share), and masks the logits before sampling or draft verification; the sampled tokens
are then fed back with `TokenConstraint.accept`. Drafts are trimmed to what the grammar allows
before they are verified, and a matcher never sees a token the engine did not keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # imported by the functions that build masks: plugins load without torch
    import torch


class TokenConstraint:
    """One request's grammar matcher. Plugins subclass this; the engine calls it from its own thread.

    A subclass implements `fill_bitmask`, `accept`, `rollback` and `num_valid`, and may override
    `fill_bitmasks` to fill many rows at once (in parallel, without a Python loop over requests)
    and `refusal` to say why a token was refused.
    """

    #: the backend's name, for logs, metrics and traces
    backend: ClassVar[str] = "unnamed"

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (int32, `bitmask_words` wide).

        Never called once the request has finished (after its last token, or one refused)."""
        raise NotImplementedError

    def accept(self, token_id: int) -> bool:
        """Advance past ``token_id``; False when the grammar does not allow it (the state is unchanged)."""
        raise NotImplementedError

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        raise NotImplementedError

    def refusal(self) -> str | None:
        """Why the last refused token was refused, if the backend says (a limit of its own hit
        mid-answer, say): the request's error names it. Optional: None by default."""
        return None

    def num_valid(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of ``token_ids`` the grammar allows in a row from the current state."""
        raise NotImplementedError

    @classmethod
    def fill_bitmasks(
        cls, constraints: Sequence[TokenConstraint], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """`fill_bitmask` for each constraint into its row; subclasses fill them all in one call."""
        for constraint, row in zip(constraints, rows, strict=True):
            constraint.fill_bitmask(bitmask, row)


def bitmask_words(vocab_size: int) -> int:
    """int32 words per bitmask row."""
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A bool ``[rows, vocab_size]`` tensor: which tokens each bitmask row allows."""
    import torch

    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask.unsqueeze(-1) >> bits) & 1).bool().view(bitmask.shape[0], -1)[:, :vocab_size]


def fill_rows(constraints: Sequence[TokenConstraint], vocab_size: int) -> torch.Tensor:
    """A bitmask with row ``i`` filled by ``constraints[i]``, grouping constraints by backend for batch fills."""
    import torch

    bitmask = torch.full((len(constraints), bitmask_words(vocab_size)), -1, dtype=torch.int32)
    by_class: dict[type[TokenConstraint], list[int]] = {}
    for row, constraint in enumerate(constraints):
        by_class.setdefault(type(constraint), []).append(row)
    for backend, rows in by_class.items():
        backend.fill_bitmasks([constraints[row] for row in rows], bitmask, rows)
    return bitmask
