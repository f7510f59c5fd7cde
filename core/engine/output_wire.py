"""Outputs as plain tuples for the engine process's pipe, and back.

The engine's process builds these rows in place of `RequestOutput`s (`LLMEngine.send_wire_outputs`):
no object per request per step, and a flat tuple of numbers, strings and lists pickles in C where a
dataclass goes through its ``__reduce_ex__``. The prompt stays behind: the server has it.
"""

from spyglass.core.engine.output_processor import draft_counts
from spyglass.core.engine.outputs import CompletionOutput, Logprob, RequestOutput
from spyglass.core.engine.request import Request

WireOutput = tuple
"""``(request_id, finished, num_cached_tokens, text, token_ids, finish_reason, stop_reason,
logprobs, prompt_logprobs, pooled, metrics)``: each logprob ``(token_id, logprob, top)``, each
prompt logprob None or ``(token_id, logprob, top, rank)``, metrics those of `RequestOutput`."""


def wire_output(
    request: Request,
    text: str,
    token_ids: list[int],
    logprobs: list[Logprob] | None,
    finished: bool,
    prompt_logprobs: list[Logprob | None] | None,
) -> WireOutput:
    """The `OutputBuilder` of a `WireOutput`."""
    reason = request.finish_reason
    return (
        request.req_id,
        finished,
        request.num_cached_tokens,
        text,
        token_ids,
        None if reason is None else reason.value,
        request.stop_reason,
        None if logprobs is None else [(lp.token_id, lp.logprob, lp.top) for lp in logprobs],
        None
        if prompt_logprobs is None
        else [
            None if lp is None else (lp.token_id, lp.logprob, lp.top, lp.rank)
            for lp in prompt_logprobs
        ],
        request.pooled,
        draft_counts(request) if finished else {},
    )


def from_wire(rows: list[WireOutput]) -> list[RequestOutput]:
    """The outputs of `wire_output`'s rows, with no prompt (None and an empty list) until one is
    put back."""
    return [
        RequestOutput(
            request_id,
            None,
            [],
            [
                CompletionOutput(
                    0,
                    text,
                    token_ids,
                    finish_reason,
                    stop_reason,
                    None if logprobs is None else [Logprob(*lp) for lp in logprobs],
                )
            ],
            finished,
            num_cached_tokens,
            metrics,
            None
            if prompt_logprobs is None
            else [None if lp is None else Logprob(*lp) for lp in prompt_logprobs],
            pooled,
        )
        for (
            request_id,
            finished,
            num_cached_tokens,
            text,
            token_ids,
            finish_reason,
            stop_reason,
            logprobs,
            prompt_logprobs,
            pooled,
            metrics,
        ) in rows
    ]
