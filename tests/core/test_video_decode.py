"""Videos to frames: container files PyAV writes here (mp4, webm, avi, mkv) decode to the frames
vLLM's uniform sampling picks, identified by colour, at the sampled rate; vLLM's data URL of
base64 frames round-trips; offline frames are taken as given; and every bad input is refused
with the request's field named."""

import base64
import io

import av
import numpy as np
import pytest
from PIL import Image

from spyglass.core.engine import image_preprocess, video_decode
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.engine.video_decode import (
    video_from_bytes,
    video_from_data_url,
    video_from_frames,
)
from spyglass.core.engine.video_sampling import VideoSampling

FIELD = "messages[0].content[1].video_url"
WIDTH, HEIGHT = 64, 48

# 24 solid colours far enough apart that lossy codecs cannot confuse them.
COLOURS = [(10 * i + 10, 200 - 7 * i, (97 * i) % 256) for i in range(24)]

# (container format, codec, pixel format): B-frames (libx264), no frame count in the header
# (webm, mkv), intra-only (mjpeg, ffv1).
FORMATS = [
    ("mp4", "mpeg4", "yuv420p"),
    ("mp4", "libx264", "yuv420p"),
    ("webm", "libvpx", "yuv420p"),
    ("avi", "mjpeg", "yuvj420p"),
    ("matroska", "ffv1", "yuv420p"),
]


def make_video(
    colours=COLOURS, fmt="mp4", codec="mpeg4", pix_fmt="yuv420p", rate=12, options=None
) -> bytes:
    """A video file of one solid-coloured ``WIDTH`` x ``HEIGHT`` frame per colour."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, options=options)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, pix_fmt
        stream.bit_rate = 2_000_000
        container.start_encoding()  # the header, written even when there are no frames
        for colour in colours:
            pixels = np.full((HEIGHT, WIDTH, 3), colour, np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def colour_index(image: Image.Image) -> int:
    """The index of the colour in `COLOURS` nearest ``image``'s mean colour."""
    mean = np.asarray(image.convert("RGB"), dtype=float).mean(axis=(0, 1))
    return int(np.argmin([np.abs(mean - colour).sum() for colour in COLOURS]))


def data_url(mime: str, *chunks: bytes) -> str:
    return f"data:{mime};base64," + ",".join(base64.b64encode(c).decode() for c in chunks)


def image_bytes(colour, size=(WIDTH, HEIGHT), fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format=fmt)
    return buffer.getvalue()


def refused(call, *args, match: str | None = None):
    with pytest.raises(InvalidRequestError, match=match) as caught:
        call(*args)
    assert caught.value.param == FIELD
    assert FIELD in str(caught.value) or "data URL" in str(caught.value)


@pytest.mark.parametrize(("fmt", "codec", "pix_fmt"), FORMATS)
def test_a_container_file_is_sampled_as_vllm_samples(fmt, codec, pix_fmt):
    if codec not in av.codecs_available:
        pytest.skip(f"{codec} is not in this PyAV build")
    data = make_video(fmt=fmt, codec=codec, pix_fmt=pix_fmt)
    video = video_from_bytes(data, FIELD, VideoSampling(8))
    expected = np.linspace(0, 23, 8, dtype=int).tolist()
    assert (
        [colour_index(frame) for frame in video.frames] == expected == [0, 3, 6, 9, 13, 16, 19, 23]
    )
    assert {frame.size for frame in video.frames} == {(WIDTH, HEIGHT)}
    assert video.fps == pytest.approx(4.0)  # 8 frames over 24 frames at 12 per second


def test_a_short_video_keeps_every_frame_at_its_own_rate():
    video = video_from_bytes(make_video(COLOURS[:5], rate=25), FIELD, VideoSampling(8))
    assert [colour_index(frame) for frame in video.frames] == [0, 1, 2, 3, 4]
    assert video.fps == pytest.approx(25.0)


def test_a_truncated_stream_is_sampled_from_the_frames_it_holds():
    # A raw H.264 stream cut short: its last packets may yield no frame, so the packets counted
    # overstate the frames, and the sampling must follow the frames decoded.
    data = make_video(fmt="h264", codec="libx264", options={"x264-params": "keyint=1:bframes=0"})
    for cut in range(len(data) // 2, len(data) + 1, len(data) // 20):
        try:
            every = video_from_bytes(data[:cut], FIELD, VideoSampling(len(COLOURS)))
        except InvalidRequestError:
            continue  # cut inside a frame's header: refused, as it should be
        sampled = video_from_bytes(data[:cut], FIELD, VideoSampling(4))
        picks = np.linspace(0, len(every.frames) - 1, 4, dtype=int)
        assert [np.asarray(frame).tolist() for frame in sampled.frames] == [
            np.asarray(every.frames[i]).tolist() for i in picks
        ]


def test_sampled_indices():
    assert VideoSampling(8).indices(5, None) == [0, 1, 2, 3, 4]
    assert VideoSampling(1).indices(10, 30.0) == [0]
    assert VideoSampling(4).indices(100, None) == [0, 33, 66, 99]


def test_a_container_data_url_decodes_its_file():
    url = data_url("video/webm", make_video(fmt="webm", codec="libvpx"))
    video = video_from_data_url(url, FIELD, VideoSampling(4))
    assert [colour_index(frame) for frame in video.frames] == [0, 7, 15, 23]
    assert video.fps == pytest.approx(2.0)


def test_png_frames_data_url_round_trips_exactly():
    colours = COLOURS[:6]
    url = data_url("video/png", *(image_bytes(colour) for colour in colours))
    video = video_from_data_url(url, FIELD, VideoSampling(32))
    assert video.fps is None
    assert [frame.convert("RGB").getpixel((5, 5)) for frame in video.frames] == colours


def test_jpeg_frames_data_url_is_sampled_within_jpeg_error():
    url = data_url("video/jpeg", *(image_bytes(colour, fmt="JPEG") for colour in COLOURS))
    video = video_from_data_url(url, FIELD, VideoSampling(8))
    assert [colour_index(frame) for frame in video.frames] == [0, 3, 6, 9, 13, 16, 19, 23]
    for frame, index in zip(video.frames, [0, 3, 6, 9, 13, 16, 19, 23]):
        mean = np.asarray(frame, dtype=float).mean(axis=(0, 1))
        assert np.abs(mean - COLOURS[index]).max() < 4


def test_offline_frames_in_each_form():
    pixels = np.stack([np.full((HEIGHT, WIDTH, 3), c, np.uint8) for c in COLOURS[:3]])
    for value in (pixels, list(pixels), tuple(Image.fromarray(p) for p in pixels)):
        video = video_from_frames(value, FIELD)
        assert video.fps is None
        assert [np.asarray(frame).tolist() for frame in video.frames] == pixels.tolist()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("https://example.com/cat.mp4", "--allowed-media-domains"),
        ("data:video/mp4,AAAA", "base64 data URLs"),
        (data_url("image/png", image_bytes((1, 2, 3))), "'image/png'"),
        ("data:video/mp4;base64,not base64!", "not valid base64"),
        ("data:video/jpeg;base64,AAAA,%%%", "not valid base64"),
        (data_url("video/jpeg", b"not an image"), "not a readable image"),
        (data_url("video/mp4", b"not a video at all"), "not a readable video"),
    ],
)
def test_bad_data_urls_are_refused(url, match):
    refused(video_from_data_url, url, FIELD, VideoSampling(8), match=match)


def test_frames_of_different_sizes_are_refused():
    url = data_url("video/png", image_bytes((0, 0, 0)), image_bytes((9, 9, 9), size=(32, 32)))
    refused(video_from_data_url, url, FIELD, VideoSampling(8), match="32x32, 64x48")


def test_bad_files_are_refused():
    mp4 = make_video()
    refused(video_from_bytes, b"\x00" * 1000, FIELD, VideoSampling(8), match="not a readable video")
    refused(
        video_from_bytes,
        mp4[: len(mp4) // 2],
        FIELD,
        VideoSampling(8),
        match="not a readable video",
    )
    refused(video_from_bytes, image_bytes((1, 2, 3), fmt="GIF")[:20], FIELD, VideoSampling(8))


def test_a_file_without_video_is_refused():
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=8000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 800), np.int16), format="s16", layout="mono"
        )
        frame.sample_rate = 8000
        container.mux(stream.encode(frame))
        container.mux(stream.encode())
    refused(video_from_bytes, buffer.getvalue(), FIELD, VideoSampling(8), match="no video stream")


def test_a_video_without_frames_is_refused():
    data = make_video(colours=[], fmt="avi", codec="mjpeg", pix_fmt="yuvj420p")
    refused(video_from_bytes, data, FIELD, VideoSampling(8), match="no frames")


def test_too_many_frames_are_refused(monkeypatch):
    monkeypatch.setattr(video_decode, "MAX_VIDEO_FRAMES_DECODED", 20)
    refused(video_from_bytes, make_video(), FIELD, VideoSampling(8), match="at most 20 frames")


def test_too_many_pixels_in_all_are_refused_before_decoding(monkeypatch):
    # 24 frames of 64 x 48: refused past 10 frames' pixels while counting, before decoding.
    monkeypatch.setattr(video_decode, "MAX_VIDEO_PIXELS_DECODED", 10 * WIDTH * HEIGHT)
    decoded = []
    monkeypatch.setattr(video_decode, "_decode_sampled", lambda *args: decoded.append(args))
    refused(video_from_bytes, make_video(), FIELD, VideoSampling(8), match="pixels in all")
    assert not decoded
    monkeypatch.undo()
    monkeypatch.setattr(video_decode, "MAX_VIDEO_PIXELS_DECODED", 24 * WIDTH * HEIGHT)
    assert len(video_from_bytes(make_video(), FIELD, VideoSampling(8)).frames) == 8


def test_too_large_frames_are_refused(monkeypatch):
    monkeypatch.setattr(image_preprocess, "MAX_IMAGE_PIXELS", WIDTH * HEIGHT - 1)
    refused(video_from_bytes, make_video(), FIELD, VideoSampling(8), match="64x48")
    url = data_url("video/png", image_bytes((1, 2, 3)))
    refused(video_from_data_url, url, FIELD, VideoSampling(8), match="too large")


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ([], "no frames"),
        (np.zeros((0, HEIGHT, WIDTH, 3), np.uint8), "no frames"),
        (np.zeros((HEIGHT, WIDTH, 3), np.uint8), r"not \[48, 64, 3\]"),
        ([np.zeros((HEIGHT, WIDTH, 4), np.uint8)], r"not \[48, 64, 4\]"),
        ([np.zeros((HEIGHT, WIDTH, 3), np.float32)], "not float32"),
        (["frame"], "not str"),
        ("video.mp4", "not str"),
        ([np.zeros((HEIGHT, WIDTH, 3), np.uint8), Image.new("RGB", (8, 8))], "8x8, 64x48"),
    ],
)
def test_bad_offline_frames_are_refused(value, match):
    refused(video_from_frames, value, FIELD, match=match)
