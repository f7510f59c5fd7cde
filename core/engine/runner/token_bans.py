"""The tokens a request may not sample next: its EOS and stop tokens while it is short of
``min_tokens``, and the last token of each bad word whose other tokens it has just generated."""

from collections.abc import Sequence

from spyglass.core.engine.request import Request


def banned_tokens(request: Request, drafted: Sequence[int] = ()) -> list[int]:
    """Token ids to mask for ``request``'s next token, after its output (a pending token counted:
    async scheduling samples before it is on the host) and then ``drafted`` (the drafts before a
    verification row)."""
    params = request.sampling_params
    if not (params.min_tokens or request.bad_word_ids):
        return []
    banned: list[int] = []
    num_before = request.num_output_tokens + request.num_pending_tokens + len(drafted)
    if num_before < params.min_tokens:
        banned += request.eos_token_ids
        banned += params.stop_token_ids
    for word in request.bad_word_ids:
        if len(word) == 1 or _ends_with(request.output_token_ids, drafted, word[:-1]):
            banned.append(word[-1])
    return banned


def _ends_with(output: list[int], drafted: Sequence[int], prefix: Sequence[int]) -> bool:
    """Whether ``output`` then ``drafted`` end with ``prefix`` (copying only their last tokens)."""
    tail = (output[-len(prefix) :] + list(drafted))[-len(prefix) :]
    return tail == list(prefix)
