"""Image bytes to pixels: decoding refuses what is no image, truncated or too large with the request's
field named; the pixels equal transformers' PIL-based ``CLIPImageProcessorPil`` (and
``LlavaImageProcessorPil`` for padding to a square) on every mode, size and aspect ratio."""

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from spyglass.core.engine import image_preprocess
from spyglass.core.engine.image_preprocess import decode_image, pixel_values
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.models.vision_config import VisionConfig

FIELD = "messages[0].content[1].image_url"

# (width, height): wide, tall, square, odd, and smaller than every crop below.
SIZES = [(64, 48), (30, 71), (40, 40), (33, 17), (101, 37), (9, 13)]
MODES = ["RGB", "RGBA", "L", "LA", "P", "P-transparent", "CMYK"]

# Preprocessing options: LLaVA-1.5's shape (shortest edge = crop), a crop larger than the resized
# image (transformers pads), a straight square resize (bilinear), and LLaVA's pad to a square.
PREPROCESSING = {
    "shortest-edge": dict(resize_shortest_edge=24),
    "crop-pads": dict(resize_shortest_edge=20),
    "square-resize": dict(resize_shortest_edge=0, resample=2),
    "pad-to-square": dict(resize_shortest_edge=28, pad_to_square=True),
    "pad-no-crop": dict(resize_shortest_edge=24, pad_to_square=True, center_crop=False),
}


def vision(**preprocessing) -> VisionConfig:
    """A `VisionConfig` for 24-pixel images (the tower's shape does not matter here)."""
    tower = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1)
    return VisionConfig(**tower, image_size=24, patch_size=8, image_token_id=0, **preprocessing)


def random_image(mode: str, size: tuple[int, int], seed: int = 0) -> Image.Image:
    """A noisy ``mode`` image; ``P-transparent`` is a palette image with a transparent index."""
    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8), "RGBA")
    if mode == "P-transparent":
        image = rgba.convert("RGB").quantize(16)
        image.info["transparency"] = 3
        return image
    if mode == "P":
        return rgba.convert("RGB").quantize(16)
    return rgba.convert(mode)


def transformers_pixels(image: Image.Image, config: VisionConfig) -> torch.Tensor:
    """transformers' pixels for ``image`` under ``config``'s preprocessor_config.json options."""
    from transformers import CLIPImageProcessorPil, LlavaImageProcessorPil

    edge, size = config.resize_shortest_edge, config.image_size
    options = dict(
        size={"shortest_edge": edge} if edge else {"height": size, "width": size},
        crop_size={"height": size, "width": size},
        do_center_crop=config.center_crop,
        resample=config.resample,
        rescale_factor=config.rescale_factor,
        image_mean=list(config.image_mean),
        image_std=list(config.image_std),
    )
    if config.pad_to_square:
        processor = LlavaImageProcessorPil(do_pad=True, **options)
    else:
        processor = CLIPImageProcessorPil(**options)
    return processor(images=image, return_tensors="pt")["pixel_values"][0]


@pytest.mark.parametrize("preprocessing", list(PREPROCESSING))
@pytest.mark.parametrize("mode", MODES)
def test_pixels_match_transformers(preprocessing, mode):
    config = vision(**PREPROCESSING[preprocessing])
    for seed, size in enumerate(SIZES):
        image = random_image(mode, size, seed)
        ours = pixel_values(image, config).values
        expected = transformers_pixels(image, config)[None]
        assert ours.dtype == torch.float32
        assert ours.shape == (1, 3, 24, 24) == expected.shape
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_sixteen_bit_keeps_the_high_bytes():
    # transformers' convert_to_rgb clips 16-bit values at 255 (a near-white image); ours keeps
    # each value's high byte, as Pillow itself reads 16-bit RGB files.
    config = vision(resize_shortest_edge=24)
    values = np.random.default_rng(0).integers(0, 65536, (30, 50), dtype=np.uint16)
    sixteen_bit = Image.fromarray(values)
    assert sixteen_bit.mode == "I;16"
    eight_bit = Image.fromarray((values >> 8).astype(np.uint8))
    expected = pixel_values(eight_bit, config).values
    assert torch.equal(pixel_values(sixteen_bit, config).values, expected)
    as_int32 = Image.fromarray(values.astype(np.int32))  # how Pillow opens a 16-bit PPM
    assert torch.equal(pixel_values(as_int32, config).values, expected)


def encoded(image: Image.Image, fmt: str) -> bytes:
    """``image`` saved as ``fmt``."""
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "RGBA"), ("PNG", "P"), ("JPEG", "RGB")])
def test_decodes_what_pillow_writes(fmt, mode):
    data = encoded(random_image(mode, (37, 21)), fmt)
    image = decode_image(data, FIELD)
    assert image.size == (37, 21) and image.mode == mode
    assert np.array_equal(np.array(image), np.array(Image.open(io.BytesIO(data))))


def with_png_size(data: bytes, width: int, height: int) -> bytes:
    """PNG ``data`` whose header claims ``width`` x ``height`` (CRC fixed): a small file that would
    decode to a huge image."""
    header = b"IHDR" + struct.pack(">II", width, height) + data[24:29]
    return data[:12] + header + struct.pack(">I", zlib.crc32(header)) + data[33:]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "is not a readable image"),
        (b"not an image at all", "is not a readable image"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "is not a readable image"),
        (b"GIF89a" + bytes(range(256)), "is not a readable image"),
        (encoded(random_image("RGB", (64, 64)), "PNG")[:-200], "is not a readable image"),
        (encoded(random_image("RGB", (64, 64)), "JPEG")[:300], "is not a readable image"),
        (with_png_size(encoded(random_image("L", (1, 1)), "PNG"), 10_000, 5_000), "is too large"),
    ],
    ids=["empty", "text", "png-garbage", "gif-garbage", "truncated-png", "truncated-jpeg", "huge"],
)
def test_bad_images_are_invalid_requests(data, match):
    with pytest.raises(InvalidRequestError, match=match) as raised:
        decode_image(data, FIELD)
    assert raised.value.param == FIELD
    assert FIELD in str(raised.value)


def test_pixel_limit(monkeypatch):
    data = encoded(random_image("RGB", (10, 10)), "PNG")
    assert decode_image(data, FIELD).size == (10, 10)
    monkeypatch.setattr(image_preprocess, "MAX_IMAGE_PIXELS", 99)
    with pytest.raises(InvalidRequestError, match="too large"):
        decode_image(data, FIELD)


def test_pillow_decompression_bomb_errors_are_invalid_requests(monkeypatch):
    # Our limit is below Pillow's, so its warning never fires first; past twice its limit its
    # open raises, which is a 400 too (100 pixels against a limit of 40 here).
    assert image_preprocess.MAX_IMAGE_PIXELS < Image.MAX_IMAGE_PIXELS
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 40)
    with pytest.raises(InvalidRequestError, match="too large") as raised:
        decode_image(encoded(random_image("RGB", (10, 10)), "PNG"), FIELD)
    assert raised.value.param == FIELD
