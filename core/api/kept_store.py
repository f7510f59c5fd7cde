"""What the server keeps in memory for later calls, by id: the most recent ``capacity`` entries,
the oldest dropped first, and a gauge that says how many are kept."""

from collections import OrderedDict
from typing import Generic, TypeVar

from prometheus_client import Gauge

from spyglass.core.api.errors import APIError

Entry = TypeVar("Entry")


class KeptStore(Generic[Entry]):
    """The last ``capacity`` entries put (or, with ``touch``, read), by id; ``gauge`` (if any)
    counts them."""

    def __init__(self, noun: str, capacity: int, gauge: Gauge | None = None, touch: bool = False):
        self.noun = noun
        """What an entry is, in errors: ``response``, ``file``, ..."""
        self.capacity = capacity
        self.gauge = gauge
        self.touch = touch
        """Whether a read makes an entry the most recent (kept the longest)."""
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def put(self, entry_id: str, entry: Entry) -> None:
        """Keep ``entry``, dropping the oldest beyond the capacity."""
        self._entries[entry_id] = entry
        self._entries.move_to_end(entry_id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        self._count()

    def get(self, entry_id: str) -> Entry | None:
        """The entry ``entry_id``, if it is still kept."""
        entry = self._entries.get(entry_id)
        if entry is not None and self.touch:
            self._entries.move_to_end(entry_id)
        return entry

    def require(self, entry_id: str, param: str, code: str | None = None) -> Entry:
        """The entry ``entry_id``; a 404 naming ``param`` (with ``code``) when it is not kept."""
        entry = self.get(entry_id)
        if entry is None:
            raise APIError(404, f"no {self.noun} {entry_id!r} is kept here", param, code)
        return entry

    def delete(self, entry_id: str) -> bool:
        """Drop the entry ``entry_id``; whether it was kept."""
        kept = self._entries.pop(entry_id, None) is not None
        self._count()
        return kept

    def _count(self) -> None:
        if self.gauge is not None:
            self.gauge.set(len(self._entries))

    def entries(self) -> list[Entry]:
        """Every kept entry, oldest first."""
        return list(self._entries.values())
