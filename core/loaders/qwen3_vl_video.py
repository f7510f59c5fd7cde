"""Qwen3-VL's video reading from its directory: the video processor's sampling and pixel budget
(``Qwen3VLVideoProcessor``'s defaults where its config is silent) and the tokens of the text
that times each step, checked against the tokenizer (`TimedFrames`)."""

from spyglass.core.models.timed_frames import TimedFrames
from spyglass.core.tokenizer import Tokenizer

# Qwen3VLVideoProcessor's defaults.
VIDEO_DEFAULTS = {
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "max_video_tokens": 768,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "rescale_factor": 1 / 255,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
# What the video processor must share with the image processor: frames are read as images are.
_SHARED = (
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "rescale_factor",
    "image_mean",
    "image_std",
)
# Times whose tokens, put together from the tokenizer's pieces, must be the tokenizer's own.
_CHECKED_TIMES = (0.0, 0.5, 1.5, 9.9, 10.0, 12.3, 107.9, 3599.5)


def video_pixels(processor: dict) -> tuple[int, int]:
    """The least and most pixels of a video's frames together (``size``'s shortest and longest
    edge, as ``Qwen3VLVideoProcessor`` names them)."""
    size = {**VIDEO_DEFAULTS["size"], **(processor.get("size") or {})}
    return size["shortest_edge"], size["longest_edge"]


def timed_frames(
    config: dict, processor: dict, image_processor: dict, tokenizer: Tokenizer
) -> TimedFrames:
    """The `TimedFrames` of a Qwen3-VL ``config`` (config.json) with its video ``processor``'s
    config and ``tokenizer``. ValueError when the video processor cuts or normalizes frames
    otherwise than the ``image_processor`` (its config, defaults included) does images, or the
    tokenizer does not read a timestamp as its pieces put together (it must split digits one by
    one, as Qwen's does)."""
    settings = {**VIDEO_DEFAULTS, **processor}
    differing = [
        key for key in _SHARED if _list_of(settings[key]) != _list_of(image_processor[key])
    ]
    if differing:
        raise ValueError(
            f"the video processor's {', '.join(differing)} differ from the image processor's; "
            "Qwen3-VL's frames are read here as its images are."
        )
    sampled = settings.get("do_sample_frames", True)
    pieces = tuple((character, _ids(tokenizer, character)) for character in "0123456789.")
    timed = TimedFrames(
        fps=float(settings["fps"]) if sampled else 0.0,
        min_frames=int(settings["min_frames"]),
        max_frames=int(settings["max_frames"]),
        frame_token_cap=int(settings["max_video_tokens"])
        if settings.get("cap_pixels_per_frame")
        else 0,
        opening_ids=_ids(tokenizer, "<"),
        character_ids=pieces,
        closing_ids=_ids(tokenizer, " seconds>"),
        start_id=config.get("vision_start_token_id", 151652),
        end_id=config.get("vision_end_token_id", 151653),
    )
    for seconds in _CHECKED_TIMES:
        text = f"<{seconds:.1f} seconds>"
        if timed.timestamp_ids(seconds) != _ids(tokenizer, text):
            raise ValueError(
                f"the tokenizer reads {text!r} otherwise than as its characters' tokens; "
                "Qwen3-VL's videos are timed by such text, which needs digits read one by one."
            )
    return timed


def _list_of(value) -> list:
    """``value`` as a list (a number as a list of one), for comparing configs."""
    return list(value) if isinstance(value, list | tuple) else [value]


def _ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text, add_special_tokens=False))
