"""Drafts for speculative decoding, asked of the proposer plugins before each schedule.

Drafts are an optimisation: a proposer that raises, or proposes something that is not a token
id, costs the step its drafts (counted as a hook error), never a request.
"""

import logging

from spyglass.core.engine.plugin_manager import SafeHookRelay
from spyglass.core.engine.request import Request

log = logging.getLogger("spyglass.engine")


class DraftCollection:
    """Sets ``spec_token_ids`` on the decoding requests that allow speculation, from the proposer
    plugin of ``method``, within each request's room and its grammar."""

    def __init__(
        self,
        hooks: SafeHookRelay,
        method: str,
        num_speculative_tokens: int,
        vocab_size: int,
        max_model_len: int,
    ):
        self._hooks = hooks
        self._method = method
        self._num_speculative_tokens = num_speculative_tokens
        self._vocab_size = vocab_size
        self._max_model_len = max_model_len

    def propose(self, running: list[Request]) -> None:
        """Ask for drafts for the ``running`` requests that decode and allow speculation."""
        candidates = tuple(
            r
            for r in running
            if r.num_computed_tokens == r.num_tokens - 1
            and r.sampling_params.speculative
            and not r.sampling_params.has_penalties
            and r.logprobs is None
        )
        if not candidates:
            return
        k = self._num_speculative_tokens
        try:
            proposals = (
                self._hooks.spyglass_propose_drafts(
                    method=self._method, requests=candidates, num_speculative_tokens=k
                )
                or {}
            )
        except Exception:
            # Without drafts every request simply decodes one token.
            self._hooks.count_error(self._method, "spyglass_propose_drafts")
            log.exception(
                "draft proposer %r failed; decoding without drafts this step", self._method
            )
            return
        for request in candidates:
            room = min(
                k,
                request.max_tokens - request.num_output_tokens - 1,
                self._max_model_len - request.num_tokens - 1,
            )
            drafts = self._valid(proposals.get(request.req_id, ()))[: max(room, 0)]
            if request.constraint is not None:
                # Only drafts the grammar allows are verified: the verifier masks by grammar position.
                drafts = drafts[: request.constraint.num_valid(drafts)]
            request.spec_token_ids = drafts

    def _valid(self, drafts) -> list[int]:
        """The drafts up to the first one that is not a token id of this vocabulary (counted as a hook error)."""
        valid = []
        for token_id in drafts:
            if type(token_id) is not int or not 0 <= token_id < self._vocab_size:
                self._hooks.count_error(self._method, "spyglass_propose_drafts")
                log.warning(
                    "draft proposer %r proposed %r, not a token id; drafts cut there",
                    self._method,
                    token_id,
                )
                break
            valid.append(token_id)
        return valid
