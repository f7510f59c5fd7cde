"""``truncation: "auto"``: a Responses conversation too long for the model's context loses its
oldest turns, as OpenAI drops items from the beginning of the conversation.

A turn begins at a user message and runs to the next one, so a function call is never parted
from its output and the template never sees an answer without its question. System and developer
messages are kept wherever they stand, and the last turn always is: when even it does not fit,
the call is the usual 400. The fewest turns are dropped that make the prompt fit beside the
answer's ``max_output_tokens`` (one token where the call sets none).
"""

from collections.abc import Awaitable, Callable

from spyglass.core.api.responses_schemas import InputItem

_KEPT_ROLES = ("system", "developer")


def turn_starts(items: list[InputItem]) -> list[int]:
    """Where each turn after the first begins: the positions of the user messages but the first."""
    users = [i for i, item in enumerate(items) if item.type == "message" and item.role == "user"]
    return [i for i in users if i > 0]


def without_turns_before(items: list[InputItem], start: int) -> list[InputItem]:
    """``items`` from ``start`` on, after the system and developer messages that stood before it."""
    instructions = [item for item in items[:start] if item.role in _KEPT_ROLES]
    return [*instructions, *items[start:]]


async def fit_conversation(
    items: list[InputItem],
    count_tokens: Callable[[list[InputItem]], Awaitable[int]],
    budget: int,
) -> tuple[list[InputItem], int]:
    """The items to send and how many were dropped: all of them when their prompt
    (``count_tokens``) is at most ``budget`` tokens, else the fewest leading turns dropped to make
    it so (all but the last turn when nothing fits)."""
    if await count_tokens(items) <= budget:
        return items, 0
    starts = turn_starts(items)
    if not starts:
        return items, 0
    # Fewer tokens with every turn dropped: search for the first start that fits.
    low, high = 0, len(starts) - 1
    while low < high:
        middle = (low + high) // 2
        if await count_tokens(without_turns_before(items, starts[middle])) <= budget:
            high = middle
        else:
            low = middle + 1
    kept = without_turns_before(items, starts[low])
    return kept, len(items) - len(kept)
