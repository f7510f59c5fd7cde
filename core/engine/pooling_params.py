"""What a pooling request asks for: vLLM's ``PoolingParams`` for the ``embed`` and ``classify``
tasks.

A pooling request is an engine request like any other (it is scheduled, chunked, cached and
preempted the same way), whose answer is a vector instead of text, from the final norm's output
at its prompt's last token (last-token pooling, as vLLM pools decoder models): that vector itself
(an embedding), or a sequence classifier's class probabilities from it. Because the last token is
always computed, prefix-cache hits serve pooling requests too.
"""

from dataclasses import dataclass
from typing import TypeVar

from spyglass.core.engine.sampling_params import InvalidRequestError

T = TypeVar("T")


POOLING_TASKS = ("embed", "classify")


@dataclass(frozen=True, slots=True)
class PoolingParams:
    """How to pool the prompt. ``task`` ``embed``: ``normalize`` scales the vector to unit length
    (cosine similarity is then a dot product); ``dimensions`` must be None or the model's hidden
    size (no served model is trained to be cut shorter, Matryoshka style). ``task`` ``classify``
    (a sequence classifier): the class probabilities, softmax over the classes (a sigmoid for a
    single one), or with ``activation`` off the raw logits (a reward model's score)."""

    task: str = "embed"
    normalize: bool = True
    dimensions: int | None = None
    activation: bool = True

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise InvalidRequestError(
                f"the pooling task must be one of {POOLING_TASKS}, got {self.task!r}", "task"
            )


def score_pairs(firsts: list[T], seconds: list[T]) -> list[tuple[T, T]]:
    """The pairs vLLM's scoring forms: one with one, one with many (``firsts`` a single item), or
    pairwise (two lists of one length); `InvalidRequestError` naming ``text_1`` otherwise."""
    if len(firsts) == 1:
        return [(firsts[0], second) for second in seconds]
    if len(firsts) != len(seconds):
        raise InvalidRequestError(
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: pair one with one, one "
            "with many, or two lists of one length",
            "text_1",
        )
    return list(zip(firsts, seconds, strict=True))
