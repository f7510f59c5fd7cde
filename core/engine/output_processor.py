"""The update of schedule, run, update: a step's sampled tokens committed to their requests, and
the requests' outputs.

A token is checked against the request's grammar and appended with its logprob, and the request
ends on EOS, a stop token, a stop string or its length. Only a request with stop strings has its
text decoded as its tokens are committed (the text can end it); the others' text is decoded when an
output reads it (with async output, after the next step is launched), a final-only output's all at
once. A streamed request's outputs are held while it has fewer than the engine's
``stream_interval`` tokens it has not sent (its first and last are never held).
"""

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from spyglass.core.engine.detokenizer import IncrementalDetokenizer
from spyglass.core.engine.kv.kv_cache_manager import KVCacheManager
from spyglass.core.engine.outputs import CompletionOutput, RequestOutput
from spyglass.core.engine.plugin_manager import SafeHookRelay
from spyglass.core.engine.request import FinishReason, Request, RequestStatus
from spyglass.core.engine.runner.model_runner import RunnerOutput
from spyglass.core.engine.runner.pooling import PoolPart, add_sums
from spyglass.core.engine.sampling_params import RequestOutputKind
from spyglass.core.engine.sched.scheduler import Scheduler, SchedulerOutput
from spyglass.core.tokenizer import Tokenizer

log = logging.getLogger("spyglass.engine")

OutputBuilder = Callable[[Request, str, list[int], list | None, bool, list | None], object]
"""Builds a request's output from the request and what the output carries: its text, token ids
and logprobs (None when not asked for), whether it is the last, and its prompt logprobs (None when
not carried)."""


def request_output(
    request: Request,
    text: str,
    token_ids: list[int],
    logprobs: list | None,
    finished: bool,
    prompt_logprobs: list | None,
) -> RequestOutput:
    """The `OutputBuilder` of a `RequestOutput` with one completion."""
    reason = request.finish_reason
    # Positional: built for every running request at every step.
    completion = CompletionOutput(
        0,
        text,
        token_ids,
        None if reason is None else reason.value,
        request.stop_reason,
        logprobs,
    )
    return RequestOutput(
        request.req_id,
        request.prompt,
        request.prompt_token_ids,
        [completion],
        finished,
        request.num_cached_tokens,
        draft_counts(request) if finished else {},
        prompt_logprobs,
        request.pooled,
    )


def draft_counts(request: Request) -> dict[str, float]:
    """A finished request's `RequestOutput.metrics`: its drafts verified and accepted, if any."""
    if not request.num_draft_tokens:
        return {}
    return {
        "num_draft_tokens": request.num_draft_tokens,
        "num_accepted_tokens": request.num_accepted_tokens,
    }


_STREAMED = (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE)
"""The output kinds whose requests read their text at every step."""


@dataclass(slots=True)
class _Sent:
    """How much of a streamed request's text (delta requests) and tokens its outputs have carried."""

    num_chars: int = 0
    num_tokens: int = 0


class OutputProcessor:
    """The engine's live requests by id and their text: what each step's tokens do to them."""

    def __init__(
        self,
        scheduler: Scheduler,
        kv: KVCacheManager,
        hooks: SafeHookRelay,
        tokenizer: Tokenizer,
        max_model_len: int,
        stream_interval: int = 1,
    ):
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        # What `output` builds (`LLMEngine.send_wire_outputs` swaps it).
        self.build: OutputBuilder = request_output
        self._sent: dict[str, _Sent] = {}
        self._scheduler = scheduler
        self._kv = kv
        self._hooks = hooks
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._stream_interval = stream_interval

    def add(self, request: Request) -> None:
        """Track a new request; its text is decoded in the context of its prompt's last tokens."""
        self.requests[request.req_id] = request
        params = request.sampling_params
        self.detokenizers[request.req_id] = IncrementalDetokenizer(
            self._tokenizer,
            request.prompt_token_ids,
            params.stop,
            min_tokens=params.min_tokens,
            include_stop=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
        )

    def commit_tokens(
        self, out: SchedulerOutput, runner_out: RunnerOutput
    ) -> tuple[list[Request], int]:
        """Advance each scheduled request by its sampled tokens; the requests that progressed or
        ended, and the tokens they took.

        A request preempted since the step's launch (async scheduling) keeps its new token, but not
        the computed count: it is recomputed from its first token."""
        progressed = []
        num_generated = 0
        now = time.monotonic()
        scored = runner_out.prompt_logprobs or ((),) * len(out.scheduled)
        pooled = runner_out.pooled or (None,) * len(out.scheduled)
        parts = runner_out.pool_parts or (None,) * len(out.scheduled)
        for scheduled, token_ids, logprobs, prompt_logprobs, answer, part in zip(
            out.scheduled, runner_out.sampled_token_ids, runner_out.logprobs, scored, pooled, parts
        ):
            request = scheduled.request
            request.num_in_flight_tokens -= scheduled.num_new_tokens
            request.num_pending_tokens -= bool(token_ids)
            if request.is_finished:
                continue
            if prompt_logprobs:
                request.prompt_logprobs.extend(prompt_logprobs)
            if request.status is RequestStatus.RUNNING:
                request.num_computed_tokens += scheduled.num_new_tokens
                if scheduled.num_spec_tokens:
                    self._settle_drafts(request, scheduled.num_spec_tokens, len(token_ids) - 1)
                self._kv.announce_full_blocks(request)
                if part is not None:
                    self._add_pool_part(request, part)
            if answer is not None:  # a pooling request's: the token sampled with it is not kept
                request.pooled = answer
                self.finish(request, FinishReason.STOP)
                progressed.append(request)
                continue
            if not token_ids:
                continue
            before = request.num_output_tokens
            for token_id, logprob in zip(token_ids, logprobs):
                self._append_token(request, token_id, logprob, now)
                if request.is_finished:
                    break
            num_generated += request.num_output_tokens - before
            progressed.append(request)
        return progressed, num_generated

    def emit(self, progressed: list[Request]) -> list[RequestOutput]:
        """The outputs of the requests that progressed, and the text they read."""
        # A request the scheduler failed since its tokens were committed has had its final output.
        live = [r for r in progressed if r.req_id in self.detokenizers]
        # Streamed requests' text first, in one pass (the tokenizer's tables stay in cache); the
        # others' is decoded when an output reads it.
        for request in live:
            if request.sampling_params.output_kind in _STREAMED:
                self._decode_new_tokens(request, self.detokenizers[request.req_id])
        return self._outputs(live)

    def update(self, out: SchedulerOutput, runner_out: RunnerOutput) -> list[RequestOutput]:
        """`commit_tokens` and `emit` at once: the outputs of a step run in turn."""
        return self._outputs(self.commit_tokens(out, runner_out)[0])

    def _outputs(self, requests: Iterable[Request]) -> list[RequestOutput]:
        return [output for r in requests if (output := self.output(r)) is not None]

    def finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        """End a request (its blocks go back to the pool) and announce it; a finished one stays so."""
        if request.is_finished:
            return
        request.error = error
        request.times.finished = time.monotonic()
        self._scheduler.finish(request, reason)
        self.requests.pop(request.req_id, None)
        self._hooks.spyglass_request_finished(request=request, reason=reason)

    def fail(self, request: Request, error: str) -> RequestOutput:
        """A plugin's decision about this request failed: end it with an error; its last output."""
        log.error("request %s failed: %s", request.req_id, error)
        self.finish(request, FinishReason.ERROR, error)
        return self.output(request)

    def fail_step(self, out: SchedulerOutput, error: Exception) -> list[RequestOutput]:
        """A failed forward fails the requests it carried, not the engine; logged once per request."""
        outputs = []
        for scheduled in out.scheduled:
            request = scheduled.request
            log.error(
                "request %s failed in model step %d: %s: %s",
                request.req_id,
                out.step_id,
                type(error).__name__,
                error,
            )
            self.finish(request, FinishReason.ERROR, f"{type(error).__name__}: {error}")
            outputs.append(self.output(request))
        return outputs

    def output(self, request: Request) -> RequestOutput | None:
        """The request's output now (`build`'s), as its `RequestOutputKind` asks: None for a
        final-only request still running, for a first-and-final one between its first output and
        its end, and for a streamed one that has sent its first token and has fewer than
        ``stream_interval`` tokens unsent. Once it is finished its text is let go."""
        kind = request.sampling_params.output_kind
        finished = request.is_finished
        if kind is RequestOutputKind.FINAL_ONLY and not finished:
            return None
        req_id = request.req_id
        token_ids, logprobs = request.output_token_ids, request.logprobs
        sent = self._sent.get(req_id)
        if sent is None:
            sent = self._sent[req_id] = _Sent()
        elif (
            not finished
            and sent.num_tokens
            and (
                kind is RequestOutputKind.FIRST_AND_FINAL
                or len(token_ids) - sent.num_tokens < self._stream_interval
            )
        ):
            return None
        detokenizer = self.detokenizers[req_id]
        self._decode_new_tokens(request, detokenizer)
        prompt_logprobs = request.prompt_logprobs
        if kind.is_delta:
            if sent.num_tokens:  # the first output carried them
                prompt_logprobs = None
            text, sent.num_chars = detokenizer.visible_since(sent.num_chars, finished)
            start, sent.num_tokens = sent.num_tokens, len(token_ids)
            token_ids = token_ids[start:]
            logprobs = None if logprobs is None else logprobs[start:]
        else:
            text = detokenizer.visible_text(finished)
            sent.num_tokens = len(token_ids)
            if not finished:  # a snapshot: the request's lists go on growing
                token_ids = list(token_ids)
                logprobs = None if logprobs is None else list(logprobs)
        if finished:
            self.detokenizers.pop(req_id)
            self._sent.pop(req_id, None)
            if detokenizer.num_restarts:
                log.warning(
                    "request %s: its output's bytes made no valid UTF-8 in %d places (U+FFFD there)",
                    req_id,
                    detokenizer.num_restarts,
                )
        return self.build(request, text, token_ids, logprobs, finished, prompt_logprobs)

    @staticmethod
    def _decode_new_tokens(request: Request, detokenizer: IncrementalDetokenizer) -> None:
        """The text of the request's tokens committed since its detokenizer last took any: a
        streamed request's one, else a run (all of them for a final-only output's); never the
        stop token that ended it (`IncrementalDetokenizer.num_textless`)."""
        with_text = len(request.output_token_ids) - detokenizer.num_textless
        unread = with_text - detokenizer.num_tokens
        if unread == 1:
            detokenizer.add_token(request.output_token_ids[with_text - 1])
        elif unread > 0:
            detokenizer.add_tokens(request.output_token_ids[detokenizer.num_tokens : with_text])

    @staticmethod
    def _add_pool_part(request: Request, part: PoolPart) -> None:
        """Add a step's sum of a pooling request's final hidden states to the request's own."""
        request.pool_sum = add_sums(request.pool_sum, part.hidden_sum)
        request.pooled_upto = part.upto

    def _settle_drafts(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """Roll the computed count back past rejected drafts (their KV slots are simply overwritten later)."""
        request.num_computed_tokens -= num_drafts - num_accepted
        request.spec_token_ids = []
        request.num_spec_steps += 1
        request.num_draft_tokens += num_drafts
        request.num_accepted_tokens += num_accepted
        self._hooks.spyglass_drafts_verified(
            request=request, num_draft_tokens=num_drafts, num_accepted_tokens=num_accepted
        )

    def _append_token(
        self,
        request: Request,
        token_id: int,
        logprob,
        now: float,
    ) -> None:
        if request.constraint is not None and not request.constraint.accept(token_id):
            reason = request.constraint.refusal()
            error = f"the grammar rejected sampled token {token_id}"
            self.finish(request, FinishReason.ERROR, f"{error}: {reason}" if reason else error)
            return
        request.output_token_ids.append(token_id)
        if request.logprobs is not None:
            request.logprobs.append(logprob)
        request.times.last_token = now
        if request.num_output_tokens == 1:
            request.times.first_token = now
            self._hooks.spyglass_request_first_token(request=request)
        detokenizer = self.detokenizers[request.req_id]
        params = request.sampling_params
        stop_token = token_id in request.eos_token_ids or token_id in params.stop_token_ids
        if stop_token and not params.include_stop_str_in_output:
            detokenizer.num_textless = 1
        elif detokenizer.stop:  # its text may end it: decoded now (other text waits for a read)
            detokenizer.add_token(token_id)
        # Sampling holds stop tokens off under min_tokens unless nothing else was allowed: one
        # sampled ends the request.
        if token_id in request.eos_token_ids:
            self.finish(request, FinishReason.STOP)
        elif token_id in params.stop_token_ids:
            request.stop_reason = token_id
            self.finish(request, FinishReason.STOP)
        elif detokenizer.matched_stop is not None:
            request.stop_reason = detokenizer.matched_stop
            self.finish(request, FinishReason.STOP)
        elif (
            request.num_output_tokens >= request.max_tokens
            or request.num_tokens >= self._max_model_len
        ):
            self.finish(request, FinishReason.LENGTH)
