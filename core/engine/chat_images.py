"""A vision model's conversation: its images and videos taken out of its messages' content
parts, each part left as ``{"type": "image"}`` or ``{"type": "video"}`` (what vision models' chat
templates render as their placeholders), and rendered by a template that reads content parts or
one that reads strings."""

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spyglass.core.engine.image_preprocess import decode_image
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.engine.video_decode import (
    VideoFrames,
    video_from_bytes,
    video_from_data_url,
    video_from_frames,
)
from spyglass.core.engine.video_sampling import DEFAULT_VIDEO_SAMPLING, VideoSampling
from spyglass.core.tokenizer import Tokenizer

IMAGE_PART_TYPES = ("image_url", "image", "image_pil")
"""Content part types that hold an image: OpenAI's ``image_url`` (a data URL), and ``image`` or
vLLM's ``image_pil`` holding a PIL image (offline)."""

VIDEO_PART_TYPES = ("video_url", "video")
"""Content part types that hold a video: vLLM's ``video_url`` (a data URL), and ``video`` holding
its frames (offline: an array ``[frames, height, width, 3]`` or a list of PIL images)."""

UNSERVED_PART_TYPES = ("input_audio", "audio_url")
"""Content part types of other media (vLLM's): refused, never passed to the template as text."""


@dataclass(frozen=True, slots=True)
class ChatMedia:
    """A conversation's images (PIL images) and videos, each in the order they appear."""

    images: list = field(default_factory=list)
    videos: list[VideoFrames] = field(default_factory=list)


def take_images(
    messages: list[dict[str, Any]],
    field: str,
    fetched: Mapping[str, bytes] | None = None,
    sampling: VideoSampling = DEFAULT_VIDEO_SAMPLING,
) -> tuple[list[dict], ChatMedia]:
    """``messages`` with each image part replaced by ``{"type": "image"}`` and each video part by
    ``{"type": "video"}``, and their `ChatMedia` (an ``image_url`` or ``video_url`` part's
    decoded from its data URL, or from ``fetched``, the bytes the HTTP server fetched for other
    URLs; a video file's frames sampled as ``sampling`` says)."""
    media = ChatMedia()
    plain = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            plain.append(message)
            continue
        parts = []
        for part in content:
            if part.get("type") in UNSERVED_PART_TYPES:
                raise InvalidRequestError(
                    f"{part['type']!r} content parts are not supported: images and videos are "
                    "the only media served",
                    field,
                )
            if part.get("type") in IMAGE_PART_TYPES:
                media.images.append(_image_of(part, field, fetched or {}))
                parts.append({"type": "image"})
            elif part.get("type") in VIDEO_PART_TYPES:
                media.videos.append(_video_of(part, field, fetched or {}, sampling))
                parts.append({"type": "video"})
            else:
                parts.append(part)
        plain.append({**message, "content": parts})
    return plain, media


def _image_of(part: dict, field: str, fetched: Mapping[str, bytes]):
    kind = part["type"]
    value = part.get(kind)
    if kind == "image_url":
        url = value.get("url") if isinstance(value, dict) else value
        data = fetched[url] if url in fetched else data_url_bytes(url, field)
        return decode_image(data, field)
    if value is None:
        raise InvalidRequestError(f"an {kind!r} content part holds no image", field)
    return value


def _video_of(
    part: dict, field: str, fetched: Mapping[str, bytes], sampling: VideoSampling
) -> VideoFrames:
    kind = part["type"]
    value = part.get(kind)
    if kind == "video":
        return video_from_frames(value, field)
    url = value.get("url") if isinstance(value, dict) else value
    if url in fetched:
        return video_from_bytes(fetched[url], field, sampling)
    return video_from_data_url(url, field, sampling)


def data_url_bytes(url: str, field: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; `InvalidRequestError` naming ``field`` for any other
    URL or bad base64."""
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise InvalidRequestError(
            "images must be given as base64 data URLs (data:image/png;base64,...); only the "
            "HTTP server fetches image URLs, from the hosts --allowed-media-domains names",
            field,
        )
    try:
        return base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError) as error:
        message = f"the image's data URL is not valid base64: {error}"
        raise InvalidRequestError(message, field) from error


def render_with_images(
    tokenizer: Tokenizer, messages: list[dict], image_text: str, **options
) -> str:
    """A vision model's chat template's text for ``messages`` (image parts as `take_images`
    leaves them). A template that reads content parts gets every message's content as parts
    (text as ``{"type": "text", ...}``) and writes the image placeholders itself; one that reads
    content as a string gets each message's images as lines of ``image_text`` before its text,
    as vLLM gives them."""
    if reads_content_parts(tokenizer):
        return tokenizer.apply_chat_template([_as_parts(m) for m in messages], **options)
    return tokenizer.apply_chat_template([_as_string(m, image_text) for m in messages], **options)


def reads_content_parts(tokenizer: Tokenizer) -> bool:
    """Whether the chat template renders a message whose content is a list of parts by their
    text (it loops over them), not as the list's Python form."""
    probe = "spyglass-probe"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": probe}]}]
    )
    return probe in text and "'type'" not in text


def _as_parts(message: dict) -> dict:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    return message


def _as_string(message: dict, image_text: str) -> dict:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    images = sum(part.get("type") == "image" for part in content)
    texts = [part.get("text", "") for part in content if part.get("type") == "text"]
    return {**message, "content": f"{image_text}\n" * images + "\n".join(texts)}
