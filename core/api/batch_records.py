"""What OpenAI's online batches keep: files (`StoredFile`: batch inputs, outputs and errors) and
batches (`BatchRun`: where one stands)."""

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from spyglass.core.api.schemas import Metadata

BATCH_ID_HEADER = "x-spyglass-batch-id"
"""Sent with each call of an online batch: its spans name the batch."""


@dataclass(frozen=True, slots=True)
class StoredFile:
    """A kept file: its name, purpose and bytes."""

    filename: str
    purpose: str
    content: bytes
    id: str = field(default_factory=lambda: f"file-{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def card(self) -> dict:
        """The file object the API returns."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


@dataclass(slots=True, eq=False)  # by identity: a set holds the running ones
class BatchRun:
    """One batch: what it answers, how far it got, and the files it wrote. ``status`` goes
    ``in_progress``, ``finalizing``, then ``completed``, or ``cancelling`` then ``cancelled``;
    ``times`` holds when each status began (``in_progress_at``, ``completed_at``, ...)."""

    endpoint: str
    input_file_id: str
    total: int
    metadata: Metadata = field(default_factory=dict)
    id: str = field(default_factory=lambda: f"batch_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "in_progress"
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, int] = field(default_factory=dict)
    task: asyncio.Task | None = None

    def enter(self, status: str) -> None:
        """Move to ``status``, noting when."""
        self.status = status
        self.times[f"{status}_at"] = int(time.time())

    def card(self) -> dict:
        """The batch object the API returns."""
        moments = (
            "in_progress",
            "finalizing",
            "completed",
            "failed",
            "expired",
            "cancelling",
            "cancelled",
        )
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None,
            "input_file_id": self.input_file_id,
            "completion_window": "24h",
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": None,
            **{f"{moment}_at": self.times.get(f"{moment}_at") for moment in moments},
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": self.metadata,
        }
