"""``GET /v1/responses/{id}/input_items``: the conversation a kept response was given, as the
Responses API lists items.

The list holds the items it continued (with ``previous_response_id``: the earlier turns' inputs
and answers) and its own input, each with its id; newest first unless ``order`` is ``asc``, at
most ``limit`` (1 to 100) after the item ``after`` names, as OpenAI pages them. An image part's
URL is listed only when ``include`` asks for ``message.input_image.image_url``.
"""

from spyglass.core.api.cursor_pages import CursorPage, page_of
from spyglass.core.api.errors import APIError
from spyglass.core.api.responses_schemas import InputImage, InputItem, OutputText

INCLUDE_IMAGE_URLS = "message.input_image.image_url"


def image_urls_included(include: list[str] | None) -> bool:
    """Whether a list's image parts show their URL (``include``); a 400 naming ``include`` for
    anything else it asks."""
    unknown = sorted(set(include or ()) - {INCLUDE_IMAGE_URLS})
    if unknown:
        message = f"include {unknown[0]!r} is not supported here (only {INCLUDE_IMAGE_URLS!r})"
        raise APIError(400, message, "include", "unsupported_parameter")
    return bool(include)


def page_of_items(items: tuple[InputItem, ...], page: CursorPage, image_urls: bool) -> dict:
    """The Responses API's list object for one page of ``items`` (given oldest first)."""
    listed = lambda item: listed_item(item, image_urls)
    return page_of(items, page, lambda item: item.id, listed, "input item {!r} in this response")


def listed_item(item: InputItem, image_urls: bool = False) -> dict:
    """One input item as the list shows it."""
    listed = {"id": item.id, "type": item.type, "status": "completed"}
    if item.type == "message":
        return listed | {"role": item.role, "content": _parts(item, image_urls)}
    if item.type == "function_call":
        return listed | {"call_id": item.call_id, "name": item.name, "arguments": item.arguments}
    if item.type == "reasoning":
        return listed | {"summary": [], "content": _reasoning_parts(item)}
    output = item.output
    text = output if isinstance(output, str) else "\n".join(part.text for part in output)
    return listed | {"call_id": item.call_id, "output": text}


def _parts(item: InputItem, image_urls: bool) -> list[dict]:
    """A message's content as typed parts (text given as a string: ``output_text`` for the
    assistant's, else ``input_text``)."""
    if isinstance(item.content, str):
        text_type = "output_text" if item.role == "assistant" else "input_text"
        return [{"type": text_type, "text": item.content}]
    parts = []
    for part in item.content:
        if isinstance(part, InputImage):
            image = {"type": "input_image", "detail": "auto", "file_id": None}
            parts.append(image | {"image_url": part.image_url if image_urls else None})
        else:
            text_type = "output_text" if isinstance(part, OutputText) else "input_text"
            parts.append({"type": text_type, "text": part.text})
    return parts


def _reasoning_parts(item: InputItem) -> list[dict]:
    """A reasoning item's text as it was given: its parts, or none when only encrypted."""
    if isinstance(item.content, list):
        return [{"type": "reasoning_text", "text": part.text} for part in item.content]
    return []
