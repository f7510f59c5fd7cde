"""The Responses API's routes for responses the server keeps: read one (``GET``, or follow a
background run's events with ``stream=true``), list the input items it was given (``GET
.../input_items``), cancel one running in the background (``POST .../cancel``) and drop one
(``DELETE``). A response the server does not keep is a 404."""

from collections.abc import AsyncIterator
from typing import Annotated, Literal

from litestar import Response, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, QueryParameter

from spyglass.core.api.context import ServingContext
from spyglass.core.api.cursor_pages import CursorPage
from spyglass.core.api.errors import APIError
from spyglass.core.api.response_items import image_urls_included, page_of_items
from spyglass.core.api.response_store import StoredResponse
from spyglass.core.api.responses import last_event
from spyglass.core.api.streaming import event_stream


@get(
    "/v1/responses/{response_id:str}",
    summary="A stored response (OpenAI Responses API)",
    tags=["openai"],
)
async def retrieve_response(
    response_id: FromPath[str],
    serving: NamedDependency[ServingContext],
    stream: Annotated[bool, QueryParameter()] = False,
    starting_after: Annotated[int, QueryParameter(ge=-1)] = -1,
    include: Annotated[list[str] | None, QueryParameter(max_items=8)] = None,
    include_obfuscation: Annotated[bool, QueryParameter()] = False,
) -> Response:
    """The response as it was returned, or so far while it runs in the background. With
    ``stream``, a background run's events after ``starting_after`` as they come (a stream
    resumed); a response that is no longer running sends its last event only, whole. It is
    returned as it was made: ``include`` (ask when creating it) and ``include_obfuscation`` are
    400s naming them."""
    for name, asked in (("include", include), ("include_obfuscation", include_obfuscation)):
        if asked:
            raise APIError(
                400,
                f"`{name}` is not supported here: a response is returned as it was made "
                "(ask for its includes when creating it)",
                name,
                "unsupported_parameter",
            )
    run = serving.background.get(response_id)
    if not stream:
        return Response(
            run.snapshot()
            if run is not None
            else serving.responses.require(response_id, "response_id").response
        )
    if run is not None:
        return event_stream(run.follow(starting_after), named=True)
    response = serving.responses.require(response_id, "response_id").response
    last = {
        "type": last_event(response),
        "response": response,
        "sequence_number": starting_after + 1,
    }
    return event_stream(_one(last), named=True)


async def _one(event: dict) -> AsyncIterator[tuple[str, dict]]:
    yield event["type"], event


@get(
    "/v1/responses/{response_id:str}/input_items",
    summary="The input items of a stored response (OpenAI Responses API)",
    tags=["openai"],
)
async def list_input_items(
    response_id: FromPath[str],
    serving: NamedDependency[ServingContext],
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], QueryParameter()] = "desc",
    after: Annotated[str | None, QueryParameter(max_length=256)] = None,
    include: Annotated[list[str] | None, QueryParameter(max_items=8)] = None,
) -> dict:
    """The items the response was given (the turns it continued, then its own input), paged."""
    image_urls = image_urls_included(include)
    page = CursorPage(order, limit, after)
    return page_of_items(
        serving.responses.require(response_id, "response_id").inputs, page, image_urls
    )


@post(
    "/v1/responses/{response_id:str}/cancel",
    summary="Cancel a background response (OpenAI Responses API)",
    tags=["openai"],
    status_code=200,
)
async def cancel_response(
    response_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """Stop a response running in the background: it is kept as ``cancelled`` with the output
    it had. Cancelling a cancelled one returns it again; any other finished one is a 400."""
    response = (await _stopped(serving, response_id)).response
    if response["status"] == "cancelled":
        return response
    reason = "it was not made in the background" if not response["background"] else "it ended"
    raise APIError(400, f"response {response_id!r} cannot be cancelled: {reason}", "response_id")


@delete(
    "/v1/responses/{response_id:str}",
    summary="Drop a stored response (OpenAI Responses API)",
    tags=["openai"],
    status_code=200,
)
async def delete_response(
    response_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> dict:
    """Drop a kept response (cancelling it first if it runs in the background): it can no
    longer be read or continued."""
    await _stopped(serving, response_id)
    serving.responses.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


async def _stopped(serving: ServingContext, response_id: str) -> StoredResponse:
    """The kept response, once a run of it in the background has been cancelled."""
    await serving.background.cancel(response_id)
    return serving.responses.require(response_id, "response_id")
