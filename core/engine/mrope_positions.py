"""M-RoPE positions of a prompt with images (Qwen2-VL): text tokens count up one by one on all
three axes; an image's tokens all sit at the position it starts at in time, and at that position
plus their row and column in the image's grid of tokens; the text after an image goes on from
the image's start plus its longer side, as transformers' ``get_rope_index`` counts. A video's
steps sit one time position apart (Qwen2.5-VL: ``tokens_per_second`` a second, truncated), and
the text after it goes on from the largest position it took, plus one, as Qwen's own
``get_rope_index`` and vLLM count (transformers 5 goes on from its longer side). Qwen3-VL's
video steps are each an image of their own, the text of their times between them."""

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
        for start, steps, rows, cols in _grids(image, vision):
            text = start - at
            parts.append(np.broadcast_to(np.arange(text) + current, (3, text)))
            current += text
            step, grid_row, grid_col = np.unravel_index(
                np.arange(steps * rows * cols), (steps, rows, cols)
            )
            time = _step_times(step, image, vision)
            parts.append(np.stack([time, grid_row, grid_col]) + current)
            current += max(int(time[-1]) + 1, rows, cols)
            at = start + steps * rows * cols
    text = num_prompt_tokens - at
    parts.append(np.broadcast_to(np.arange(text) + current, (3, text)))
    positions = np.concatenate(parts, axis=1).astype(np.int64)
    return PromptPositions(positions, int(positions.max()) + 1 - num_prompt_tokens)


def _grids(image: ImageInput, vision: VisionConfig) -> list[tuple[int, int, int, int]]:
    """``(start, steps, rows, columns)`` of each grid of ``image``'s tokens: an image's one, a
    video's one of all its steps, or Qwen3-VL's video's one a step (each run of its tokens)."""
    frames = image.clip.frames if image.clip is not None else 0
    rows, cols = qwen_grid.token_grid(*image.size, vision, frames)
    if frames and vision.timed_frames is not None:
        return [(start, 1, rows, cols) for start, _, _ in image.embedding_runs()]
    return [(image.offset, image.steps, rows, cols)]


def _step_times(step: np.ndarray, image: ImageInput, vision: VisionConfig) -> np.ndarray:
    """The time position of each token of ``image`` whose step is ``step``: the step itself, or
    Qwen2.5-VL's step start in seconds times ``tokens_per_second``, truncated (in float32, in
    that order, as Qwen's ``get_rope_index`` computes it)."""
    if image.clip is None or not vision.tokens_per_second:
        return step
    seconds = step.astype(np.float32) * np.float32(image.clip.step_seconds)
    return (seconds * np.float32(vision.tokens_per_second)).astype(np.int64)


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
