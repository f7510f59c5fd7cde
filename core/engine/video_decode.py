"""A request's video as the frames a vision model reads (Qwen2-VL, Qwen3-VL, LLaVA-OneVision),
taken as vLLM takes them: from a data URL of base64 frames (``data:video/jpeg;base64,<frame>,
<frame>,...``), from a container file (mp4, webm, avi, mkv, ...) decoded by PyAV with its frames
sampled as `VideoSampling` says (at most ``max_frames`` uniformly, as vLLM's OpenCV loader
samples them; Qwen3-VL's a few a second), or from frames given offline."""

import base64
import binascii
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import av
import numpy as np
from PIL import Image

from spyglass.core.engine import image_preprocess
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.engine.video_sampling import VideoSampling

MAX_VIDEO_FRAMES_DECODED = 100_000
"""The most frames (or packets) read from one video file, about an hour at 25 frames per second:
past it the video is refused, so a hostile file of countless tiny frames cannot hold the server."""

MAX_VIDEO_PIXELS_DECODED = 30_000_000_000
"""The most pixels decoded from one video file, its frames' pixels added up: about 10 minutes of
1080p at 25 frames a second, a minute or two of decoding on two cores. Every frame is decoded to
sample a few, so a long high-resolution file (highly compressible, small to send) is refused
before it is decoded instead of holding a worker for hours."""

FRAME_MIMES = ("video/jpeg", "video/png")
"""Data URL types whose base64 payload is vLLM's list of frames, each an image, comma-separated."""

_HOW_VIDEOS_COME = (
    "videos must be given as base64 data URLs (data:video/mp4;base64,... or "
    "data:video/jpeg;base64,<frame>,<frame>,...); only the HTTP server fetches video URLs, "
    "from the hosts --allowed-media-domains names"
)


@dataclass(frozen=True, slots=True)
class VideoFrames:
    """A video's frames (PIL RGB-convertible images, all the same size), the rate they were
    taken at, frames per second, and each one's time in the video, seconds (None: unknown)."""

    frames: tuple  # tuple[PIL.Image.Image, ...]
    fps: float | None
    times: tuple[float, ...] | None = None


def video_from_data_url(url: str, field: str, sampling: VideoSampling) -> VideoFrames:
    """The video in a base64 ``data:video/...`` URL: for `FRAME_MIMES` its comma-separated
    frames (each an image `image_preprocess.decode_image` reads; fps unknown: at most
    ``max_frames`` of them, spread evenly), else a container file `video_from_bytes` decodes
    and samples; `InvalidRequestError` naming ``field`` for any other URL or bad data."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise InvalidRequestError(_HOW_VIDEOS_COME, field)
    header, payload = url[len("data:") :].split(";base64,", 1)
    mime = header.split(";", 1)[0].strip().lower()
    if not mime.startswith("video/"):
        raise InvalidRequestError(
            f"a video's data URL has type {mime!r}: {_HOW_VIDEOS_COME}", field
        )
    if mime not in FRAME_MIMES:
        return video_from_bytes(_base64_bytes(payload, field), field, sampling)
    chunks = payload.split(",")
    picked = [_base64_bytes(chunks[i], field) for i in sampling.indices(len(chunks), None)]
    frames = [image_preprocess.decode_image(data, field) for data in picked]
    return _checked(frames, None, field)


def video_from_bytes(data: bytes, field: str, sampling: VideoSampling) -> VideoFrames:
    """The first video stream of the container file ``data`` (any format FFmpeg reads), its
    frames sampled as ``sampling`` says; ``fps`` is the sampled frames' rate (their number over
    the video's duration: its frames over its average rate), ``times`` each one's index over
    that rate. `InvalidRequestError` naming ``field`` when it is no video, corrupt, has no video
    stream or no frames, a frame over `image_preprocess.MAX_IMAGE_PIXELS` pixels, or over
    `MAX_VIDEO_FRAMES_DECODED` frames."""
    # Streams often lack a frame count and a header's may be wrong: count the packets (cheap, no
    # decoding), and should decoding yield another number, decode again knowing the true one.
    counted, rate = _count_packets(data, field)
    frames, decoded, kept = _decode_sampled(data, field, counted, rate, sampling)
    if decoded != counted and decoded:
        frames, decoded, kept = _decode_sampled(data, field, decoded, rate, sampling)
    if not decoded:
        raise InvalidRequestError(f"{field} is a video with no frames", field)
    if not rate:
        return _checked(frames, None, field)
    times = tuple(index / rate for index in kept)
    return _checked(frames, len(frames) * rate / decoded, field, times)


def video_from_frames(value, field: str) -> VideoFrames:
    """Frames given offline, as vLLM's ``multi_modal_data={"video": ...}``: a uint8 array
    ``[frames, height, width, 3]``, or a list or tuple of PIL images or uint8 ``[height, width,
    3]`` arrays; fps unknown. `InvalidRequestError` naming ``field`` for anything else."""
    if isinstance(value, np.ndarray):
        if value.ndim != 4:
            raise InvalidRequestError(
                f"{field}: a video array has shape [frames, height, width, 3], not "
                f"{list(value.shape)}",
                field,
            )
        value = list(value)
    if not isinstance(value, list | tuple):
        raise InvalidRequestError(
            f"{field}: a video is an array [frames, height, width, 3] or a list of frames, "
            f"not {type(value).__name__}",
            field,
        )
    return _checked([_frame_image(frame, field) for frame in value], None, field)


def _base64_bytes(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as error:
        message = f"the video's data URL is not valid base64: {error}"
        raise InvalidRequestError(message, field) from None


@contextmanager
def _read_as_video(field: str) -> Iterator[None]:
    """Turns PyAV's errors on bad input into an `InvalidRequestError` naming ``field``."""
    try:
        yield
    except InvalidRequestError:
        raise
    except av.error.FFmpegError as error:
        # Its str names an errno and the file ('<none>' for bytes): nothing the client can use.
        reason = error.strerror or "unreadable"
        raise InvalidRequestError(f"{field} is not a readable video: {reason}", field) from None
    except Exception as error:
        # PyAV and its codecs raise other kinds too (ValueError, EOFError, ...) on bad input.
        raise InvalidRequestError(f"{field} is not a readable video: {error}", field) from None


def _video_stream(container, field: str):
    """``container``'s first video stream, refused when absent or its frames too large."""
    if not container.streams.video:
        raise InvalidRequestError(f"{field} holds no video stream", field)
    stream = container.streams.video[0]
    _check_pixels(stream.codec_context.width, stream.codec_context.height, field)
    return stream


def _check_pixels(width: int, height: int, field: str) -> None:
    limit = image_preprocess.MAX_IMAGE_PIXELS
    if width * height > limit:
        raise InvalidRequestError(
            f"{field} is too large: a video's frame ({width}x{height}) may have at most "
            f"{limit} pixels",
            field,
        )


def _check_count(count: int, field: str) -> None:
    if count > MAX_VIDEO_FRAMES_DECODED:
        raise InvalidRequestError(
            f"{field} is too long: a video may have at most {MAX_VIDEO_FRAMES_DECODED} frames",
            field,
        )


def _check_decoded_pixels(pixels: int, field: str) -> None:
    if pixels > MAX_VIDEO_PIXELS_DECODED:
        raise InvalidRequestError(
            f"{field} is too long for its size: a video's frames may have at most "
            f"{MAX_VIDEO_PIXELS_DECODED} pixels in all (fewer frames or smaller ones)",
            field,
        )


def _count_packets(data: bytes, field: str) -> tuple[int, float | None]:
    """The number of non-empty packets of ``data``'s first video stream (one a frame, mostly)
    and the stream's average rate, frames a second (None: unknown); refused past
    `MAX_VIDEO_FRAMES_DECODED`, or past `MAX_VIDEO_PIXELS_DECODED` at the stream's frame size,
    before any is decoded."""
    count = 0
    with _read_as_video(field), av.open(io.BytesIO(data)) as container:
        stream = _video_stream(container, field)
        frame_pixels = stream.codec_context.width * stream.codec_context.height
        for packet in container.demux(stream):
            count += packet.size > 0
            _check_count(count, field)
            _check_decoded_pixels(count * frame_pixels, field)
        rate = stream.average_rate
    return count, float(rate) if rate else None


def _decode_sampled(
    data: bytes, field: str, total: int, rate: float | None, sampling: VideoSampling
):
    """``(frames, decoded, kept)``: the RGB images of the frames ``sampling`` keeps of ``total``
    taken ``rate`` a second, among those decoded in order (the rest dropped as they come), how
    many were decoded, and the indices of those kept."""
    wanted = set(sampling.indices(total, rate))
    frames, kept = [], []
    decoded = pixels = 0
    with _read_as_video(field), av.open(io.BytesIO(data)) as container:
        stream = _video_stream(container, field)
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            _check_count(decoded + 1, field)
            _check_pixels(frame.width, frame.height, field)
            pixels += frame.width * frame.height
            _check_decoded_pixels(pixels, field)
            if decoded in wanted:
                frames.append(frame.to_image())
                kept.append(decoded)
            decoded += 1
    return frames, decoded, kept


def _frame_image(frame, field: str) -> Image.Image:
    """An offline frame as a PIL image: itself, or a uint8 ``[height, width, 3]`` array's."""
    if isinstance(frame, Image.Image):
        return frame
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[-1] != 3:
        shape = list(frame.shape) if isinstance(frame, np.ndarray) else type(frame).__name__
        raise InvalidRequestError(
            f"{field}: a video frame is a PIL image or an array [height, width, 3], not {shape}",
            field,
        )
    if frame.dtype != np.uint8:
        raise InvalidRequestError(
            f"{field}: a video frame array holds uint8 values, not {frame.dtype}", field
        )
    return Image.fromarray(frame)


def _checked(
    frames: list, fps: float | None, field: str, times: tuple[float, ...] | None = None
) -> VideoFrames:
    """``frames`` as a `VideoFrames`, refused when there are none or their sizes differ."""
    if not frames:
        raise InvalidRequestError(f"{field} is a video with no frames", field)
    sizes = sorted({frame.size for frame in frames})
    if len(sizes) > 1:
        named = ", ".join(f"{width}x{height}" for width, height in sizes)
        raise InvalidRequestError(
            f"{field}: a video's frames must all be the same size, not {named}", field
        )
    return VideoFrames(tuple(frames), fps, times)
