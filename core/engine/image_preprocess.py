"""A request's image, from its bytes to the vision tower's pixels, as transformers' PIL-based
``CLIPImageProcessorPil`` (``LlavaImageProcessorPil`` when padding to a square,
``Idefics3ImageProcessorPil`` or ``LlavaNextImageProcessorPil`` when cutting it into tiles,
``Qwen2VLImageProcessorPil`` when cutting it into patches) computes them."""

import io
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from spyglass.core.engine.image_anyres import anyres_tiles
from spyglass.core.engine.image_inputs import ImagePixels, VideoClip
from spyglass.core.engine.image_patches import image_patches
from spyglass.core.engine.image_tiling import split_image
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models import pixtral_grid, qwen_grid
from spyglass.core.models.vision_config import VisionConfig

if TYPE_CHECKING:  # the video decoder reads images with this module
    from spyglass.core.engine.video_decode import VideoFrames

UNKNOWN_VIDEO_FPS = 2.0
"""The rate a video's frames are taken to be at when nothing says (frames given one by one): the
rate Qwen's own video reader samples at."""

MAX_IMAGE_PIXELS = 40_000_000
"""The largest image (width times height) a request may send: about 160 MB once decoded to RGBA.
Below Pillow's own limit (89 million), so its decompression-bomb warning never comes first."""

# Single-channel 16-bit modes (PNG and TIFF open as I;16, 16-bit PPM as I).
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def decode_image(data: bytes, field: str) -> Image.Image:
    """The fully decoded image in ``data`` (any format Pillow reads); `InvalidRequestError` naming
    ``field`` when it is no image, is truncated or corrupt, or has over `MAX_IMAGE_PIXELS` pixels."""
    try:
        image = Image.open(io.BytesIO(data))
        too_large = image.width * image.height > MAX_IMAGE_PIXELS
        if not too_large:
            image.load()
    except Image.DecompressionBombError:  # past twice Pillow's own limit, raised by open
        too_large = True
    except Image.UnidentifiedImageError:
        # Its message names the BytesIO object: nothing the client can use.
        raise InvalidRequestError(
            f"{field} is not a readable image: no image format recognised", field
        ) from None
    except Exception as error:
        # Pillow's format plugins raise many kinds of exception on bad input (OSError,
        # SyntaxError, ValueError, struct.error, ...); each means the same to the client.
        raise InvalidRequestError(f"{field} is not a readable image: {error}", field) from None
    if too_large:
        raise InvalidRequestError(
            f"{field} is too large: an image may have at most {MAX_IMAGE_PIXELS} pixels", field
        )
    return image


def _to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as RGB, transparency composited onto white as transformers' ``convert_to_rgb`` does."""
    if image.mode in _SIXTEEN_BIT_MODES:
        # Pillow's conversion clips 16-bit values at 255, whitening the image (transformers
        # keeps that); keep their high bytes instead, as Pillow does for 16-bit RGB files.
        high_bytes = np.clip(np.asarray(image), 0, 65535) >> 8
        return Image.fromarray(high_bytes.astype(np.uint8)).convert("RGB")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def _pad_to_square(image: Image.Image, color: tuple[int, ...]) -> Image.Image:
    """``image`` centred on a square of ``color`` as wide as its longer side."""
    side = max(image.size)
    square = Image.new("RGB", (side, side), color)
    square.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    return square


def _resized_size(width: int, height: int, vision: VisionConfig) -> tuple[int, int]:
    """``(width, height)`` after the resize: the shorter side to ``resize_shortest_edge``, the
    longer scaled and truncated (transformers' ``get_resize_output_image_size``), or the square."""
    edge = vision.resize_shortest_edge
    if not edge:
        return vision.image_size, vision.image_size
    if width <= height:
        return edge, int(edge * height / width)
    return int(edge * width / height), edge


def pixel_values(image: Image.Image, vision: VisionConfig, alone: bool = True) -> ImagePixels:
    """The float32 pixels the tower reads for ``image``: RGB, then either cut into tiles
    (``vision.tiles``, `image_tiling.split_image`; ``vision.grid_pinpoints``,
    `image_anyres.anyres_tiles`, unless LLaVA-OneVision's image is not ``alone`` in its prompt:
    then padded square and resized, one tile), resized to Qwen2-VL's grid and cut into patches
    (``vision.temporal_patch_size``, `image_patches`), or padded to a square of the mean colour
    (``pad_to_square``), resized and centre-cropped into one ``[1, 3, image_size, image_size]``
    tile (without ``center_crop`` the size is the resize's); rescaled and normalized."""
    image = _to_rgb(image)
    original = image.size
    if vision.tower == "pixtral":  # Mistral 3: at about its own size, one tile
        resized = image.resize(
            pixtral_grid.resized_size(*original, vision), resample=vision.resample
        )
        return ImagePixels(_normalized(np.array(resized)[None], vision), *original)
    if vision.temporal_patch_size:
        resized = image.resize(qwen_grid.resized_size(*original, vision), resample=vision.resample)
        return ImagePixels(
            image_patches(_normalized(np.array(resized)[None], vision), vision), *original
        )
    if vision.max_grid_tiles and not alone:  # LLaVA-OneVision: one of several images
        image = _pad_to_square(image, tuple(int(x * 255) for x in vision.image_mean))
        square = image.resize((vision.image_size, vision.image_size), resample=vision.resample)
        return ImagePixels(_normalized(np.array(square)[None], vision), *original)
    if vision.tiles is not None or vision.grid_pinpoints:
        if vision.tiles is not None:
            tiles = split_image(image, vision.tiles, vision.resample)
        else:
            tiles = anyres_tiles(image, vision)
        stacked = np.stack([np.asarray(tile) for tile in tiles])
        return ImagePixels(_normalized(stacked, vision), *original)
    if vision.pad_to_square:
        image = _pad_to_square(image, tuple(int(x * 255) for x in vision.image_mean))
    width, height = _resized_size(*image.size, vision)
    image = image.resize((width, height), resample=vision.resample)
    if vision.center_crop:
        size = vision.image_size
        left, top = (width - size) // 2, (height - size) // 2
        # Beyond an edge PIL's crop fills with black: transformers' center_crop zero-pads the same.
        image = image.crop((left, top, left + size, top + size))
    return ImagePixels(_normalized(np.array(image)[None], vision), *original)


def video_clip(video: "VideoFrames", vision: VisionConfig) -> VideoClip:
    """How ``vision``'s model reads ``video``: Qwen2-VL's steps of ``temporal_patch_size`` frames
    (the last perhaps short), each as long as its frames at the video's rate (None:
    `UNKNOWN_VIDEO_FPS`), and for Qwen3-VL each step's time: the mean of its first and last
    frame's (`VideoFrames.times`; a short last step's last frame is its own, repeated), as
    ``Qwen3VLProcessor`` times them; LLaVA-OneVision's a frame a step."""
    frames = len(video.frames)
    per_step = vision.temporal_patch_size or 1
    seconds = 1 / (video.fps or UNKNOWN_VIDEO_FPS)
    step_times = ()
    if vision.timed_frames is not None:
        times = video.times or tuple(index / UNKNOWN_VIDEO_FPS for index in range(frames))
        step_times = tuple(
            (times[first] + times[min(first + per_step, frames) - 1]) / 2
            for first in range(0, frames, per_step)
        )
    return VideoClip(frames, -(-frames // per_step), per_step * seconds, step_times)


def video_pixel_values(video: "VideoFrames", vision: VisionConfig) -> ImagePixels:
    """A video's `ImagePixels`: its frames (all one size) each RGB, resized, rescaled and
    normalized, and its `video_clip`. For Qwen2-VL's tower, resized to the grid its size gives a
    video's frame (`qwen_grid.resized_size`; Qwen3-VL's by its number of frames too) and cut
    into patches a step of frames at a time (`image_patches`). For LLaVA-OneVision's, each frame
    a tile: a tower-sized square (as ``LlavaOnevisionVideoProcessor`` resizes it, its aspect not
    kept)."""
    frames = list(video.frames)
    width, height = frames[0].size
    clip = video_clip(video, vision)
    if not vision.temporal_patch_size:
        side = (vision.image_size, vision.image_size)
        squares = [_to_rgb(frame).resize(side, resample=vision.resample) for frame in frames]
        pixels = _normalized(np.stack([np.asarray(square) for square in squares]), vision)
        return ImagePixels(pixels, width, height, clip)
    size = qwen_grid.resized_size(width, height, vision, len(frames))
    resized = [_to_rgb(frame).resize(size, resample=vision.resample) for frame in frames]
    pixels = _normalized(np.stack([np.asarray(frame) for frame in resized]), vision)
    return ImagePixels(image_patches(pixels, vision), width, height, clip)


def _normalized(tiles: np.ndarray, vision: VisionConfig) -> torch.Tensor:
    """``tiles [n, height, width, 3]`` (uint8) as float32 ``[n, 3, height, width]``, rescaled and
    normalized per channel: in float64, rounded to float32, then normalized in float32, as
    transformers does."""
    pixels = torch.from_numpy(tiles).permute(0, 3, 1, 2)
    pixels = (pixels.double() * vision.rescale_factor).float()
    mean = torch.tensor(vision.image_mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(vision.image_std, dtype=torch.float32).view(-1, 1, 1)
    return (pixels - mean) / std
