"""Which frames of a video file a model reads: a few spread evenly (vLLM's loaders), or a few a
second of the video (Qwen3-VL's processor)."""

from dataclasses import dataclass

import numpy as np

from spyglass.core.models.vision_config import VisionConfig

DEFAULT_VIDEO_FRAMES = 32
"""The most frames read from a video file, evenly spaced, unless ``media_io_kwargs`` says (vLLM's
default)."""


@dataclass(frozen=True, slots=True)
class VideoSampling:
    """Which frames of a video file are read: at most ``max_frames`` (at least 1), spread evenly
    from the first to the last; with ``fps``, that many a second of the video (at least
    ``min_frames``, at most ``max_frames``), as ``Qwen3VLVideoProcessor`` samples them."""

    max_frames: int
    fps: float | None = None
    min_frames: int = 1

    def indices(self, total: int, rate: float | None) -> list[int]:
        """The indices of the frames kept of ``total`` taken ``rate`` a second (None: unknown):
        by count, all of them or ``max_frames`` (``np.linspace`` truncated, as vLLM samples);
        by ``fps`` when the rate is known (``np.linspace`` rounded, as transformers samples)."""
        if self.fps is None or not rate:
            if total <= self.max_frames:
                return list(range(total))
            return np.linspace(0, total - 1, self.max_frames, dtype=int).tolist()
        count = max(int(total / rate * self.fps), self.min_frames)
        count = min(count, self.max_frames, total)
        return np.linspace(0, total - 1, count).round().astype(int).tolist()


DEFAULT_VIDEO_SAMPLING = VideoSampling(DEFAULT_VIDEO_FRAMES)
"""`DEFAULT_VIDEO_FRAMES` frames spread evenly."""


def model_sampling(max_frames: int, vision: VisionConfig | None) -> VideoSampling:
    """How a video file is sampled for ``vision``'s model: at most ``max_frames`` frames spread
    evenly, or Qwen3-VL's few a second (`TimedFrames`), at most ``max_frames`` too."""
    timed = vision.timed_frames if vision is not None else None
    if timed is None:
        return VideoSampling(max_frames)
    return VideoSampling(min(max_frames, timed.max_frames), timed.fps or None, timed.min_frames)
