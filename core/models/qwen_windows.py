"""Where each patch of Qwen2-VL's images sits and which patches attend to which: each patch's row
and column (the tower's 2D rope), and, for Qwen2.5-VL, the patches reordered window by window."""

import itertools
from dataclasses import dataclass

import torch

from spyglass.core.models.vision_config import VisionConfig


@dataclass(frozen=True, slots=True)
class ImageSegments:
    """The patches of a batch of images: ``positions [patches, 2]`` (row, column) in the
    processor's order (each merged square's patches together); ``order`` puts the patches
    window by window (the processor's order when the tower has no windows); ``images`` and
    ``windows`` are each image's and each window's patches in that order, as `segment_groups`;
    ``token_restore`` puts the merged tokens back in the processor's order."""

    positions: torch.Tensor
    order: torch.Tensor
    images: list[torch.Tensor]
    windows: list[torch.Tensor]
    token_restore: torch.Tensor


def segment_groups(bounds: list[int], device) -> list[torch.Tensor]:
    """The segments ``[bounds[i], bounds[i + 1])`` gathered by length: per length, a
    ``[segments, length]`` tensor of their positions (attention runs once per length)."""
    starts_by_length: dict[int, list[int]] = {}
    for start, end in itertools.pairwise(bounds):
        starts_by_length.setdefault(end - start, []).append(start)
    return [
        torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)
        for length, starts in starts_by_length.items()
    ]


def image_segments(
    grids: list[tuple[int, int]], vision: VisionConfig, device=None
) -> ImageSegments:
    """The `ImageSegments` of images of ``grids`` (rows, columns) patches, one after another,
    its tensors on ``device``.
    Windows are squares of ``window_size`` pixels of merged tokens, row by row, from each
    image's top left (those on its right and bottom edges cut short), as transformers'
    ``get_vision_window_index`` lays them."""
    merge = vision.scale_factor
    unit = merge * merge
    positions, token_order, images, windows, base = [], [], [0], [0], 0
    for rows, cols in grids:
        token_rows, token_cols = rows // merge, cols // merge

        def merged_order(index: torch.Tensor) -> torch.Tensor:
            blocks = index.reshape(token_rows, merge, token_cols, merge)
            return blocks.transpose(1, 2).flatten()

        row = torch.arange(rows)[:, None].expand(rows, cols)
        col = torch.arange(cols)[None, :].expand(rows, cols)
        positions.append(torch.stack([merged_order(row), merged_order(col)], dim=-1))
        tokens = torch.arange(token_rows * token_cols).view(token_rows, token_cols)
        side = max(token_rows, token_cols)
        if vision.window_size:
            side = vision.window_size // merge // vision.patch_size
        for top in range(0, token_rows, side):
            for left in range(0, token_cols, side):
                window = tokens[top : top + side, left : left + side].flatten()
                token_order.append(window + base)
                windows.append(windows[-1] + len(window) * unit)
        base += token_rows * token_cols
        images.append(images[-1] + rows * cols)
    tokens_in_order = torch.cat(token_order)
    order = (tokens_in_order[:, None] * unit + torch.arange(unit)).flatten()
    return ImageSegments(
        torch.cat(positions).to(device),
        order.to(device),
        segment_groups(images, device),
        segment_groups(windows, device),
        torch.argsort(tokens_in_order).to(device),
    )
