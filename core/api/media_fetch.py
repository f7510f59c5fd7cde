"""Image and video URLs a conversation names, fetched before it is rendered: only from the hosts
``--allowed-media-domains`` lists, within a time and a size limit, no redirects followed (a
redirect could lead past the list). Every failure is a 400 naming the conversation's field."""

import asyncio
from urllib.parse import urlsplit

import httpx

from spyglass.core.api.errors import APIError
from spyglass.core.api.schemas import ChatMessage, ImageURLPart, VideoURLPart
from spyglass.core.api.server_options import ServerOptions


def image_urls(messages: list[ChatMessage]) -> set[str]:
    """The image and video URLs of ``messages`` that are not ``data:`` URLs."""
    urls = {
        part.image_url.url if isinstance(part, ImageURLPart) else part.video_url.url
        for message in messages
        if isinstance(message.content, list)
        for part in message.content
        if isinstance(part, ImageURLPart | VideoURLPart)
    }
    return {url for url in urls if not url.startswith("data:")}


async def fetch_images(
    messages: list[ChatMessage], options: ServerOptions, param: str
) -> dict[str, bytes]:
    """The bytes behind each image and video URL of ``messages`` (none for ``data:`` URLs),
    fetched at once."""
    urls = sorted(image_urls(messages))
    for url in urls:
        _check_allowed(url, options.allowed_media_domains, param)
    if not urls:
        return {}
    async with httpx.AsyncClient(
        timeout=options.media_fetch_timeout, follow_redirects=False
    ) as client:
        fetched = await asyncio.gather(
            *(_fetch(client, url, options.max_media_bytes, param) for url in urls)
        )
    return dict(zip(urls, fetched))


def _check_allowed(url: str, domains: list[str], param: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise APIError(
            400, f"a media URL must be a data: URL or an http(s) URL, not {url[:80]!r}", param
        )
    if "*" not in domains and parts.hostname not in domains:
        listed = ", ".join(domains) or "none: the server fetches no media URLs"
        raise APIError(
            400,
            f"media are not fetched from {parts.hostname} (--allowed-media-domains: {listed}); "
            "send the image or video as a base64 data: URL",
            param,
        )


async def _fetch(client: httpx.AsyncClient, url: str, limit: int, param: str) -> bytes:
    """``url``'s body: a 400 for an answer other than 200, a body over ``limit`` bytes, a
    timeout or a connection that fails."""
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise APIError(
                    400, f"fetching {url[:80]} answered HTTP {response.status_code}", param
                )
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise APIError(400, f"{url[:80]} is over the {limit}-byte limit", param)
            return bytes(body)
    except httpx.HTTPError as error:
        raise APIError(400, f"could not fetch {url[:80]}: {type(error).__name__}", param) from error
