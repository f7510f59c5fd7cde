"""Beam search over the engine's one-token steps, as vLLM runs it.

Each round asks the engine for one token of every live beam (its prompt is the beam's tokens so
far, so the prefix cache serves all but its newest block), reads the ``2 * beam_width`` most likely
next tokens of each, and keeps the ``beam_width`` best continuations by cumulative log-probability.
A continuation that ends in an EOS token is finished (unless ``ignore_eos``); after ``max_tokens``
rounds the finished and live beams are ranked together by ``cum_logprob / len ** length_penalty``
(``len`` counts the prompt and leaves a final EOS out, as vLLM's and transformers' scores do).
`BeamSearch` is the bookkeeping; `LLM.beam_search` and the HTTP API drive it.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BeamSearchParams:
    """vLLM's beam-search settings: beams kept, tokens generated at most, EOS ignored or not, and
    the length penalty of the final ranking."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.beam_width < 1 or self.max_tokens < 1:
            raise ValueError("beam_width and max_tokens must be at least 1")


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: all its tokens (the prompt's first), their summed log-probability, and, once the
    search ends, the text of its generated tokens and why it ended (``stop`` or ``length``)."""

    tokens: list[int]
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None


@dataclass(slots=True)
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence] = field(default_factory=list)


class BeamSearch:
    """The beams of one prompt between rounds."""

    def __init__(
        self,
        prompt_token_ids: list[int],
        params: BeamSearchParams,
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
    ):
        self.params = params
        self.max_model_len = max_model_len
        self.prompt_len = len(prompt_token_ids)
        self.eos_token_ids = () if params.ignore_eos else eos_token_ids
        self.live = [BeamSearchSequence(list(prompt_token_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.rounds = 0

    @property
    def num_candidates(self) -> int:
        """How many next tokens each beam's step reports: enough to fill the beams after EOS ends some."""
        return 2 * self.params.beam_width

    @property
    def done(self) -> bool:
        """Whether no beam is left to extend, every round ran, or the beams fill the context."""
        return (
            not self.live
            or self.rounds >= self.params.max_tokens
            or len(self.live[0].tokens) >= self.max_model_len
        )

    def advance(self, candidates: list[dict[int, float]]) -> None:
        """One round: ``candidates[i]`` is live beam ``i``'s next tokens and their log-probabilities."""
        extended = []
        for beam, top in zip(self.live, candidates, strict=True):
            for token_id, logprob in top.items():
                child = BeamSearchSequence(beam.tokens + [token_id], beam.cum_logprob + logprob)
                if token_id in self.eos_token_ids:
                    child.finish_reason = "stop"
                    self.finished.append(child)
                else:
                    extended.append(child)
        extended.sort(key=lambda b: b.cum_logprob, reverse=True)
        self.live = extended[: self.params.beam_width]
        self.rounds += 1

    def best(self) -> list[BeamSearchSequence]:
        """The ``beam_width`` best sequences, finished or cut at ``max_tokens``, best first."""
        for beam in self.live:
            beam.finish_reason = "length"
        ranked = sorted(self.finished + self.live, key=self.score, reverse=True)
        return ranked[: self.params.beam_width]

    def score(self, beam: BeamSearchSequence) -> float:
        """``cum_logprob / len ** length_penalty``, ``len`` without a final EOS."""
        length = len(beam.tokens) - (beam.finish_reason == "stop")
        return beam.cum_logprob / length**self.params.length_penalty

    def generated(self, beam: BeamSearchSequence) -> list[int]:
        """The beam's generated tokens (a final EOS left out)."""
        end = len(beam.tokens) - (beam.finish_reason == "stop")
        return beam.tokens[self.prompt_len : end]
