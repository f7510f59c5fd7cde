"""Outputs as differences, for a pipe: what a request's output adds to the one sent before it.

A `RequestOutput` is cumulative (all of its text and token ids so far), so sending each one whole
would cost a request's length on every step. The engine process sends an `OutputDelta` instead
(`DeltaEncoder`), and the server process rebuilds the cumulative output (`DeltaDecoder`).
"""

from dataclasses import dataclass

from spyglass.core.engine.outputs import CompletionOutput, Logprob, RequestOutput


@dataclass(frozen=True, slots=True)
class CompletionDelta:
    """One sequence's change: keep the first ``*_kept`` items of the previous output, then append the tail."""

    index: int
    text_kept: int
    text_tail: str
    tokens_kept: int
    token_tail: list[int]
    logprobs_kept: int
    logprob_tail: list[Logprob] | None
    finish_reason: str | None
    stop_reason: str | int | None


@dataclass(frozen=True, slots=True)
class OutputDelta:
    """A request's output as a change to its previous one; the prompt travels with the first only."""

    request_id: str
    completions: list[CompletionDelta]
    finished: bool
    num_cached_tokens: int
    metrics: dict[str, float]
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    """Set on a request's first delta only."""


class DeltaEncoder:
    """Engine side: remembers what was last sent of each request."""

    def __init__(self) -> None:
        self._sent: dict[str, list[CompletionOutput]] = {}

    def encode(self, output: RequestOutput) -> OutputDelta:
        """``output`` as a change to the previous output of its request (whole, for the first)."""
        previous = self._sent.get(output.request_id)
        completions = [
            _completion_delta(c, previous[i] if previous and i < len(previous) else None)
            for i, c in enumerate(output.outputs)
        ]
        if output.finished:
            self._sent.pop(output.request_id, None)
        else:
            self._sent[output.request_id] = list(output.outputs)
        first = previous is None
        return OutputDelta(
            request_id=output.request_id,
            completions=completions,
            finished=output.finished,
            num_cached_tokens=output.num_cached_tokens,
            metrics=output.metrics,
            prompt=output.prompt if first else None,
            prompt_token_ids=output.prompt_token_ids if first else None,
        )

    def forget(self, request_id: str) -> None:
        """Drop a request that ends without a finished output (an abort)."""
        self._sent.pop(request_id, None)


class DeltaDecoder:
    """Server side: rebuilds each request's cumulative output from its deltas."""

    def __init__(self) -> None:
        self._outputs: dict[str, RequestOutput] = {}

    def decode(self, delta: OutputDelta) -> RequestOutput | None:
        """The cumulative output; None for a request forgotten meanwhile (its listener has gone)."""
        previous = self._outputs.get(delta.request_id)
        if previous is None and delta.prompt_token_ids is None:
            return None
        prompt = previous.prompt if previous else delta.prompt
        prompt_token_ids = previous.prompt_token_ids if previous else delta.prompt_token_ids
        completions = [
            _apply(d, previous.outputs[i] if previous and i < len(previous.outputs) else None)
            for i, d in enumerate(delta.completions)
        ]
        output = RequestOutput(
            request_id=delta.request_id,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            outputs=completions,
            finished=delta.finished,
            num_cached_tokens=delta.num_cached_tokens,
            metrics=delta.metrics,
        )
        if delta.finished:
            self._outputs.pop(delta.request_id, None)
        else:
            self._outputs[delta.request_id] = output
        return output

    def forget(self, request_id: str) -> None:
        """Drop a request that ended without a finished output."""
        self._outputs.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._outputs)


def _kept(new, old) -> int:
    """How many leading items of ``old`` start ``new`` too (all of them, nearly always)."""
    if isinstance(new, str) and new.startswith(old):
        return len(old)
    if not isinstance(new, str) and len(new) >= len(old) and new[: len(old)] == old:
        return len(old)
    kept = 0
    for a, b in zip(new, old):
        if a != b:
            break
        kept += 1
    return kept


def _completion_delta(new: CompletionOutput, old: CompletionOutput | None) -> CompletionDelta:
    text_kept = _kept(new.text, old.text) if old else 0
    tokens_kept = _kept(new.token_ids, old.token_ids) if old else 0
    logprobs_kept = 0
    if old and new.logprobs is not None and old.logprobs is not None:
        logprobs_kept = _kept(new.logprobs, old.logprobs)
    return CompletionDelta(
        index=new.index,
        text_kept=text_kept,
        text_tail=new.text[text_kept:],
        tokens_kept=tokens_kept,
        token_tail=new.token_ids[tokens_kept:],
        logprobs_kept=logprobs_kept,
        logprob_tail=None if new.logprobs is None else new.logprobs[logprobs_kept:],
        finish_reason=new.finish_reason,
        stop_reason=new.stop_reason,
    )


def _apply(delta: CompletionDelta, old: CompletionOutput | None) -> CompletionOutput:
    logprobs = None
    if delta.logprob_tail is not None:
        kept = old.logprobs[: delta.logprobs_kept] if old and old.logprobs else []
        logprobs = kept + delta.logprob_tail
    return CompletionOutput(
        index=delta.index,
        text=(old.text[: delta.text_kept] if old else "") + delta.text_tail,
        token_ids=(old.token_ids[: delta.tokens_kept] if old else []) + delta.token_tail,
        finish_reason=delta.finish_reason,
        stop_reason=delta.stop_reason,
        logprobs=logprobs,
    )
