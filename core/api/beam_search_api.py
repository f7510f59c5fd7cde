"""``use_beam_search`` on completions and chat (vLLM's): the ``n`` best beams, ranked, whole.

Beam search ranks continuations by the model's own log-probabilities, so the fields that shape
sampling or the output (temperatures other than 0 and 1, top-p/k, min-p, penalties, stop
conditions, logprobs, constraints, tools, streaming) cannot be honoured with it: each is a 400
that names it. ``n`` is the beam width, at most `MAX_BEAM_WIDTH` (each beam's step reports its
``2 * n`` best next tokens, and a step reports at most `MAX_LOGPROBS`).
"""

import asyncio
import dataclasses

from spyglass.core.api.context import ServingContext
from spyglass.core.api.errors import APIError
from spyglass.core.api.schemas import SamplingFields
from spyglass.core.engine.beam_search import BeamSearch, BeamSearchParams, BeamSearchSequence
from spyglass.core.engine.sampling_params import MAX_LOGPROBS, RequestOutputKind, SamplingParams

MAX_BEAM_WIDTH = MAX_LOGPROBS // 2

# Field -> its neutral value (or values): anything else cannot be honoured by beam search.
_NEUTRAL = {
    "stream": (False,),
    # None (left out): beam search ranks by the model's own log-probabilities, whatever the
    # model's sampling defaults (--generation-config) say.
    "temperature": (None, 0.0, 1.0),
    "top_p": (None, 1.0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0.0),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "repetition_penalty": (None, 1.0),
    "stop": (None, [], ""),
    "stop_token_ids": (None, []),
    "min_tokens": (0,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "logit_bias": (None, {}),
    "response_format": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "return_tokens_as_token_ids": (False,),
    "truncate_prompt_tokens": (None,),
    "logprobs": (None, False),
    "top_logprobs": (None,),
    "prompt_logprobs": (None,),
    "echo": (False,),
    "best_of": (None,),
    "tools": (None, []),
    "prediction": (None,),
    "thinking_token_budget": (None,),
}


def check_beam_search(body: SamplingFields, max_tokens: int) -> BeamSearchParams | None:
    """The request's beam-search settings (None without ``use_beam_search``) for at most
    ``max_tokens`` tokens; a 400 naming a field that cannot be honoured with it, or
    ``length_penalty`` without it."""
    if not body.use_beam_search:
        if body.length_penalty != 1.0:
            raise APIError(400, "length_penalty needs use_beam_search", "length_penalty")
        return None
    for name, neutral in _NEUTRAL.items():
        if getattr(body, name, None) not in neutral:
            raise APIError(400, f"`{name}` cannot be used with use_beam_search", name)
    if body.n > MAX_BEAM_WIDTH:
        raise APIError(
            400, f"with use_beam_search, n (the beam width) is at most {MAX_BEAM_WIDTH}", "n"
        )
    return BeamSearchParams(
        beam_width=body.n,
        max_tokens=max_tokens,
        ignore_eos=body.ignore_eos,
        length_penalty=body.length_penalty,
    )


async def run_beam_search(
    serving: ServingContext,
    base_id: str,
    prompt_token_ids: list[int],
    params: BeamSearchParams,
    request_params: SamplingParams,
    attributes: dict,
    lora_name: str | None,
) -> tuple[BeamSearch, list[BeamSearchSequence]]:
    """The search and its best beams (their ``text`` set): one round of one-token engine requests
    for every live beam at a time, each with the request's own settings (priority, cache salt,
    SLO target) but greedy, of one token, reporting the next tokens' log-probabilities."""
    search = BeamSearch(
        prompt_token_ids, params, serving.tokenizer.eos_token_ids, serving.max_model_len
    )
    one_token = dataclasses.replace(
        request_params,
        temperature=0.0,
        max_tokens=1,
        ignore_eos=True,
        n=1,
        logprobs=min(MAX_LOGPROBS, search.num_candidates),
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    attributes = {**attributes, "num_choices": len(search.live)}
    while not search.done:
        tops = await asyncio.gather(
            *(
                _next_tokens(
                    serving,
                    f"{base_id}-r{search.rounds}-{i}",
                    beam,
                    one_token,
                    attributes,
                    lora_name,
                )
                for i, beam in enumerate(search.live)
            )
        )
        search.advance(tops)
    best = search.best()
    for beam in best:
        beam.text = serving.tokenizer.decode(search.generated(beam), skip_special_tokens=True)
    return search, best


async def _next_tokens(
    serving: ServingContext,
    req_id: str,
    beam: BeamSearchSequence,
    params: SamplingParams,
    attributes: dict,
    lora_name: str | None,
) -> dict[int, float]:
    """The beam's most likely next tokens and their log-probabilities."""
    stream = serving.async_engine.generate(req_id, beam.tokens, params, None, attributes, lora_name)
    async for output in stream:
        if output.finished:
            return output.outputs[0].logprobs[0].top
    raise APIError(500, "the engine ended a beam's step without its output")
