"""The HTTP server's span as the engine process sees it, with ``--engine-process``.

The tracing plugin decorates the recording SERVER span a request came under (its input, output,
user, errors) and never ends a request's spans after it. Across a process boundary that span is
remote, so the engine process gets a `ServerSpanMirror` in its place: it records what the plugin
sets (`drain_changes`), the server applies the changes to the real span while it is open
(`apply_changes`), and `end_time` is set when the client has gone (`mark_abandoned`), so children
are cut there as they are in one process.
"""

import threading
import weakref
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, Status


@dataclass(frozen=True, slots=True)
class SpanChange:
    """One call the plugin made on a mirror: ``method(*args)`` on the span ``span_id``."""

    span_id: int
    method: str
    args: tuple


class ServerSpanMirror(trace.Span):
    """A recording stand-in for a remote SERVER span: it keeps the calls made on it, to send back."""

    kind = SpanKind.SERVER

    def __init__(self, span_context: SpanContext, journal: "ChangeJournal"):
        self._span_context = span_context
        self._journal = journal
        self.end_time: int | None = None
        """When the client left (epoch ns), as far as the engine process knows; None while it is there."""

    def get_span_context(self) -> SpanContext:
        return self._span_context

    def is_recording(self) -> bool:
        return self.end_time is None

    def _record(self, method: str, *args) -> None:
        self._journal.add(SpanChange(self._span_context.span_id, method, args))

    def set_attribute(self, key, value) -> None:
        self._record("set_attribute", key, value)

    def set_attributes(self, attributes) -> None:
        self._record("set_attributes", dict(attributes))

    def add_event(self, name, attributes=None, timestamp=None) -> None:
        self._record("add_event", name, dict(attributes or {}), timestamp)

    def set_status(self, status, description=None) -> None:
        if isinstance(status, Status):
            self._record("set_status", Status(status.status_code, status.description))
        else:
            self._record("set_status", Status(status, description))

    def record_exception(self, exception, attributes=None, timestamp=None, escaped=False) -> None:
        self.add_event(
            "exception",
            {
                "exception.type": type(exception).__name__,
                "exception.message": str(exception),
                **(attributes or {}),
            },
            timestamp,
        )

    def update_name(self, name) -> None:
        self._record("update_name", name)

    def end(self, end_time=None) -> None:
        """The server ends its span, not the engine process."""


class ChangeJournal:
    """The changes made on this process's mirrors since the last `drain`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changes: list[SpanChange] = []

    def add(self, change: SpanChange) -> None:
        with self._lock:
            self._changes.append(change)

    def drain(self) -> list[SpanChange]:
        with self._lock:
            changes, self._changes = self._changes, []
        return changes


class OpenServerSpans:
    """The server's live SERVER spans that requests went out under, by span id (weakly held)."""

    def __init__(self) -> None:
        self._spans: weakref.WeakValueDictionary[int, trace.Span] = weakref.WeakValueDictionary()

    def remember(self, span: trace.Span) -> None:
        self._spans[span.get_span_context().span_id] = span

    def apply(self, changes: list[SpanChange]) -> None:
        """Apply each change to its span if the span is still open (a late one, after an abort, is dropped)."""
        for change in changes:
            span = self._spans.get(change.span_id)
            if span is not None and getattr(span, "end_time", None) is None:
                getattr(span, change.method)(*change.args)
