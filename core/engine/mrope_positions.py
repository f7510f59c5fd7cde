"""M-RoPE positions of a prompt with images (Qwen2-VL): text tokens count up one by one on all
three axes; an image's tokens all sit at the position it starts at in time, and at that position
plus their row and column in the image's grid of tokens; the text after an image goes on from
the image's start plus its longer side, as transformers' ``get_rope_index`` counts."""

from dataclasses import dataclass

import numpy as np

from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.models import qwen_grid
from spyglass.core.models.vision_config import VisionConfig


@dataclass(frozen=True, slots=True)
class PromptPositions:
    """A prompt's M-RoPE ``positions [3, prompt tokens]``; token ``p`` past the prompt sits at
    ``p + delta`` on every axis (``delta`` <= 0: images take fewer positions than tokens)."""

    positions: np.ndarray
    delta: int

    def at(self, start: int, end: int) -> np.ndarray:
        """The ``[3, end - start]`` positions of tokens ``[start, end)``."""
        length = self.positions.shape[1]
        past = np.arange(max(start, length), max(end, length)) + self.delta
        return np.concatenate(
            [self.positions[:, start : min(end, length)], np.broadcast_to(past, (3, len(past)))],
            axis=1,
        )


def prompt_positions(
    num_prompt_tokens: int, images: tuple[ImageInput, ...], vision: VisionConfig
) -> PromptPositions:
    """The `PromptPositions` of a prompt of ``num_prompt_tokens`` whose ``images`` are placed
    (their token spans in order)."""
    parts, current, at = [], 0, 0
    for image in images:
        text = image.offset - at
        parts.append(np.broadcast_to(np.arange(text) + current, (3, text)))
        current += text
        rows, cols = qwen_grid.token_grid(*image.size, vision)
        grid_row, grid_col = np.divmod(np.arange(rows * cols), cols)
        parts.append(np.stack([np.zeros(rows * cols, np.int64), grid_row, grid_col]) + current)
        current += max(rows, cols)
        at = image.end
    text = num_prompt_tokens - at
    parts.append(np.broadcast_to(np.arange(text) + current, (3, text)))
    positions = np.concatenate(parts, axis=1).astype(np.int64)
    return PromptPositions(positions, int(positions.max()) + 1 - num_prompt_tokens)


def step_rope_positions(
    rope_positions: list[PromptPositions | None],
    starts: np.ndarray,
    ends: np.ndarray,
    query_start: np.ndarray,
    positions: np.ndarray,
) -> np.ndarray:
    """A step's rope positions: ``positions`` (each token's index in its sequence) where no
    request has `PromptPositions`; else those requests' tokens at theirs, as ``[3, tokens]``
    when an image token is among them and as one row when not (the axes agree)."""
    if not any(p is not None for p in rope_positions):
        return positions
    three = np.broadcast_to(positions, (3, len(positions))).copy()
    for index, prompt in enumerate(rope_positions):
        if prompt is not None:
            rows = slice(int(query_start[index]), int(query_start[index + 1]))
            three[:, rows] = prompt.at(int(starts[index]), int(ends[index]))
    return three if (three != three[0]).any() else three[0]
