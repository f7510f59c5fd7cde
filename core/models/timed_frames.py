"""How Qwen3-VL reads a video: its frames sampled at a rate of the video's own time, sized with
one pixel budget for all of them, and each step of frames (two) behind the text of its time,
``<{seconds:.1f} seconds>``, between the vision start and end tokens, as ``Qwen3VLProcessor``
writes it and vLLM tokenizes it (each timestamp on its own)."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TimedFrames:
    """Qwen3-VL's video reading (see the module).

    Sampling (``Qwen3VLVideoProcessor``): ``fps`` frames a second of the video, at least
    ``min_frames``, at most ``max_frames`` (and at most the video's own). Sizing: the frames'
    sides in multiples of a merged patch with their pixels, times the frames (rounded to whole
    steps), between the video processor's ``min_pixels`` and ``max_pixels``
    (`VisionConfig.video_min_pixels` and ``video_max_pixels``); with ``frame_token_cap``
    (``cap_pixels_per_frame``'s ``max_video_tokens``; 0: none) a frame's share of the budget is at
    most that many patches and the budget grows no further than the frames need.

    Tokens: a timestamp is the token ids of ``<``, of each of its characters (digits and the
    point), and of `` seconds>``, put together (the tokenizer reads digits one by one, which the
    loader checks); ``start_id`` and ``end_id`` enclose each step's video tokens."""

    fps: float
    min_frames: int
    max_frames: int
    frame_token_cap: int
    opening_ids: tuple[int, ...]
    character_ids: tuple[tuple[str, tuple[int, ...]], ...]
    closing_ids: tuple[int, ...]
    start_id: int
    end_id: int

    def timestamp_ids(self, seconds: float) -> tuple[int, ...]:
        """The tokens of ``<{seconds:.1f} seconds>``."""
        pieces = dict(self.character_ids)
        middle = (token for character in f"{seconds:.1f}" for token in pieces[character])
        return (*self.opening_ids, *middle, *self.closing_ids)
