"""Qwen2-VL's multimodal rotary embedding (M-RoPE): a token has three positions (time, image row,
image column); the rotation's frequencies are cut into ``mrope_section`` runs, the first rotated
by the time position, the second by the row, the third by the column. Qwen3-VL's
(``mrope_interleaved``) deals them out in turn instead: frequency ``j`` turns by the row when
``j % 3 == 1`` and ``j < 3 * sections[1]``, by the column when ``j % 3 == 2`` and
``j < 3 * sections[2]``, else by the time. A text token's three positions are equal, so text
rotates as plain rope does."""

import torch

from spyglass.core.models.rope import RotaryEmbedding, RotaryTables


class MultimodalRotaryEmbedding(RotaryEmbedding):
    """The default rope tables, read per section: `at` takes ``[3, tokens]`` positions (or one
    ``[tokens]`` row, shared by all three axes) and gathers each token's own cos and sin rows."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict, dtype, device
    ):
        super().__init__(head_dim, max_positions, theta, scaling, dtype, device)
        sections = list(scaling["mrope_section"])
        if sum(sections) != head_dim // 2 or len(sections) != 3:
            raise ValueError(
                f"mrope_section {sections} must be three runs of frequencies summing to "
                f"head_dim / 2 = {head_dim // 2}"
            )
        axis = torch.repeat_interleave(torch.arange(3), torch.tensor(sections))
        if scaling.get("mrope_interleaved"):
            axis = interleaved_axes(head_dim // 2, sections)
        # Which of the three positions rotates each column of a head (both halves alike).
        self.axis_of_column = torch.cat([axis, axis]).to(device)
        self.columns = torch.arange(head_dim, device=device)

    def at(self, positions: torch.Tensor) -> RotaryTables:
        """The tables for a step whose tokens sit at ``positions``: ``[tokens]`` as plain rope,
        or ``[3, tokens]``: then each token's own rows, read through ``arange(tokens)``."""
        if positions.dim() == 1:
            return super().at(positions)
        rows = positions.t()[:, self.axis_of_column]
        return RotaryTables(
            torch.arange(positions.shape[1], device=positions.device),
            self.cos[rows, self.columns],
            self.sin[rows, self.columns],
        )


def interleaved_axes(num_frequencies: int, sections: list[int]) -> torch.Tensor:
    """Which position (0: time, 1: row, 2: column) turns each frequency in Qwen3-VL's layout."""
    frequency = torch.arange(num_frequencies)
    axis = torch.zeros(num_frequencies, dtype=torch.long)
    for position in (1, 2):
        axis[(frequency % 3 == position) & (frequency < 3 * sections[position])] = position
    return axis


def rotary_embedding(
    head_dim: int, max_positions: int, theta: float, scaling: dict | None, dtype, device
) -> RotaryEmbedding:
    """The rope of a model whose ``rope_scaling`` is ``scaling``: M-RoPE's for ``"mrope"``."""
    if (scaling or {}).get("rope_type") == "mrope":
        return MultimodalRotaryEmbedding(head_dim, max_positions, theta, scaling, dtype, device)
    return RotaryEmbedding(head_dim, max_positions, theta, scaling, dtype, device)
