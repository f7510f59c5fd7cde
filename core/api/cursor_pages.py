"""OpenAI's cursor-paged lists (``limit``, ``order``, ``after``): a page of entries as
``{"object": "list", "data", "first_id", "last_id", "has_more"}``."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from spyglass.core.api.errors import APIError

Entry = TypeVar("Entry")


@dataclass(frozen=True, slots=True)
class CursorPage:
    """Which entries of a list to return: ``order`` (``asc`` or ``desc``), at most ``limit`` of
    them, after the entry whose id is ``after`` (from the start when None)."""

    order: str = "desc"
    limit: int = 20
    after: str | None = None


def page_of(
    entries: Sequence[Entry],
    page: CursorPage,
    id_of: Callable[[Entry], str],
    listed: Callable[[Entry], dict],
    where: str,
) -> dict:
    """The list object for one page of ``entries`` (given oldest first), each shown by ``listed``;
    an ``after`` that names none of them is a 400 naming ``after`` (``where`` says what was
    searched, as in "no input item 'x' in this response")."""
    ordered = list(entries) if page.order == "asc" else list(reversed(entries))
    start = 0
    if page.after is not None:
        ids = [id_of(entry) for entry in ordered]
        if page.after not in ids:
            raise APIError(400, f"no {where.format(page.after)}", "after")
        start = ids.index(page.after) + 1
    chosen = ordered[start : start + page.limit]
    return {
        "object": "list",
        "data": [listed(entry) for entry in chosen],
        "first_id": id_of(chosen[0]) if chosen else None,
        "last_id": id_of(chosen[-1]) if chosen else None,
        "has_more": start + page.limit < len(ordered),
    }
