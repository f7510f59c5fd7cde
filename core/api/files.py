"""OpenAI's Files API, for batches: upload a batch input file (``POST /v1/files``, multipart,
``purpose: "batch"``), list, read, download (``.../content``) and delete files; a batch's output
and error files are kept here too (``purpose: "batch_output"``). Kept in the server's memory, the
last ``--batches-store-size`` files; an upload is at most ``--max-body-bytes``. A file the server
does not keep is a 404."""

from dataclasses import dataclass
from typing import Annotated, Literal

from litestar import Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath, QueryParameter

from spyglass.core.api.batch_records import StoredFile
from spyglass.core.api.context import ServingContext
from spyglass.core.api.cursor_pages import CursorPage, page_of
from spyglass.core.api.errors import APIError


@dataclass
class FileUpload:
    """``POST /v1/files``'s form: the file, and what it is for."""

    file: UploadFile
    purpose: str


@post("/v1/files", summary="Upload a batch input file (OpenAI Files API)", tags=["openai"])
async def create_file(
    data: Annotated[FileUpload, Body(media_type=RequestEncodingType.MULTI_PART)],
    request: Request,
    serving: NamedDependency[ServingContext],
) -> Response:
    """Keep the uploaded file (``purpose`` must be ``batch``): its file object. Another form
    field (OpenAI's ``expires_after``: files here are kept until newer ones push them out) is a
    400 naming it."""
    unknown = sorted(set((await request.form()).keys()) - {"file", "purpose"})
    if unknown:
        message = f"`{unknown[0]}` is not supported by this server"
        raise APIError(400, message, unknown[0][:64], "unsupported_parameter")
    if data.purpose != "batch":
        message = f"purpose {data.purpose!r} is not kept here: only batch input files ('batch')"
        raise APIError(400, message, "purpose", "unsupported_parameter")
    if not serving.files.capacity:
        message = "this server keeps no files: start it with --batches-store-size N"
        raise APIError(400, message, "file", "unsupported_parameter")
    stored = StoredFile(data.file.filename or "upload.jsonl", "batch", await data.file.read())
    serving.files.put(stored.id, stored)
    return Response(stored.card(), status_code=200)


@get("/v1/files", summary="Kept files (OpenAI Files API)", tags=["openai"])
async def list_files(
    serving: NamedDependency[ServingContext],
    purpose: Annotated[str | None, QueryParameter(max_length=64)] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=10000)] = 10000,
    order: Annotated[Literal["asc", "desc"], QueryParameter()] = "desc",
    after: Annotated[str | None, QueryParameter(max_length=256)] = None,
) -> dict:
    """The kept files (of ``purpose``), newest first unless ``order`` is ``asc``, paged."""
    files = [f for f in serving.files.entries() if purpose is None or f.purpose == purpose]
    page = CursorPage(order, limit, after)
    return page_of(files, page, lambda f: f.id, StoredFile.card, "file {!r} among those listed")


@get("/v1/files/{file_id:str}", summary="A kept file (OpenAI Files API)", tags=["openai"])
async def retrieve_file(file_id: FromPath[str], serving: NamedDependency[ServingContext]) -> dict:
    """The file object."""
    return serving.files.require(file_id, "file_id").card()


@get(
    "/v1/files/{file_id:str}/content",
    summary="A kept file's content (OpenAI Files API)",
    tags=["openai"],
    media_type="application/jsonl",
)
async def retrieve_file_content(
    file_id: FromPath[str], serving: NamedDependency[ServingContext]
) -> bytes:
    """The file's bytes, as uploaded or written by a batch."""
    return serving.files.require(file_id, "file_id").content


@delete(
    "/v1/files/{file_id:str}",
    summary="Delete a kept file (OpenAI Files API)",
    tags=["openai"],
    status_code=200,
)
async def delete_file(file_id: FromPath[str], serving: NamedDependency[ServingContext]) -> dict:
    """Drop the file: ``{"id", "object": "file", "deleted": true}``."""
    serving.files.require(file_id, "file_id")
    serving.files.delete(file_id)
    return {"id": file_id, "object": "file", "deleted": True}
