"""``POST /v1/completions``: text completions for one or more prompts, streamed or not.

``best_of`` generates that many candidates per prompt (engine requests like ``n``'s) and returns
the ``n`` whose tokens have the highest summed logprob, as OpenAI and vLLM do; streamed calls need
``best_of == n``. ``suffix`` fills in the middle between the prompt and it, on a code model whose
vocabulary has the tokens (`fill_in_middle`).
"""

import dataclasses
import time
from collections.abc import AsyncIterator

from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.beam_search_api import check_beam_search, run_beam_search
from spyglass.core.api.context import ServingContext
from spyglass.core.api.convert import (
    TokenNames,
    check_finished,
    completion_logprobs,
    continuous_usage,
    make_usage,
    new_id,
    prompt_logprobs,
    request_attributes,
    sampling_params,
    token_ids_if,
)
from spyglass.core.api.errors import APIError
from spyglass.core.api.generation import (
    RequestGroup,
    fan_out,
    output_kind,
    unless_disconnected,
)
from spyglass.core.api.prompts import count_prompts, encode_text, parse_prompts
from spyglass.core.api.schemas import (
    INT64,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from spyglass.core.api.streaming import event_stream
from spyglass.core.api.validation import json_body_guard
from spyglass.core.engine.beam_search import BeamSearchParams
from spyglass.core.engine.outputs import RequestOutput

DEFAULT_MAX_TOKENS = 16


@post(
    "/v1/completions",
    summary="Create a completion",
    tags=["openai"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": CompletionRequest},
)
async def create_completion(
    data: JSONBody[CompletionRequest], request: Request, serving: NamedDependency[ServingContext]
) -> Response:
    """OpenAI's completions endpoint; ``stream=true`` answers with server-sent events."""
    lora_name = serving.check_model(data.model)
    serving.admit()
    max_tokens = data.max_tokens
    if max_tokens is None:
        max_tokens = serving.sampling_defaults.max_tokens or DEFAULT_MAX_TOKENS
    _check_suffix(serving, data)
    beams = check_beam_search(data, max_tokens)
    if beams is not None:
        if data.suffix:
            raise APIError(400, "suffix does not combine with beam search", "suffix")
        return Response(
            await unless_disconnected(
                request, _beam_search(serving, request, data, beams, lora_name)
            )
        )
    best_of = _best_of(data)
    params = sampling_params(data, max_tokens, data.logprobs, serving.sampling_defaults)
    scored = _scored_prompt_logprobs(data)
    if scored is not None:
        params = dataclasses.replace(params, prompt_logprobs=scored)
    if best_of > data.n:
        # Candidates are ranked by their tokens' logprobs: each one needs at least the sampled token's.
        params = dataclasses.replace(params, n=best_of, logprobs=params.logprobs or 0)
    response_id = new_id("cmpl")
    attributes = request_attributes(
        data, "text_completion", response_id, serving.model_name, request.headers
    )
    if data.suffix:
        attributes["fill_in_middle"] = True
    with serving.queue_slots(count_prompts(data.prompt) * best_of):
        prompts = await parse_prompts(
            serving,
            data.prompt,
            data.truncate_prompt_tokens is None,
            add_special_tokens=data.add_special_tokens and not data.suffix,
        )
        if data.suffix:
            prompts = await _filled_in(serving, data, prompts)
        group = RequestGroup(
            serving.async_engine,
            response_id,
            fan_out(prompts, params),
            attributes,
            lora_name,
            output_kind(data.stream),
        )
        await unless_disconnected(request, group.start())
    writer = _CompletionWriter(serving, data, response_id)
    if data.stream:
        return event_stream(writer.chunks(group))
    return Response(await unless_disconnected(request, writer.collect(group)))


async def _beam_search(
    serving: ServingContext,
    request: Request,
    data: CompletionRequest,
    beams: BeamSearchParams,
    lora_name: str | None,
) -> CompletionResponse:
    """The ``n`` best beams of each prompt, best first (choice ``i * n + j``: prompt ``i``'s beam ``j``)."""
    response_id = new_id("cmpl")
    attributes = request_attributes(
        data, "text_completion", response_id, serving.model_name, request.headers
    )
    choices, prompt_tokens, completion_tokens = [], 0, 0
    with serving.queue_slots(count_prompts(data.prompt) * beams.beam_width):
        prompts = await parse_prompts(
            serving, data.prompt, add_special_tokens=data.add_special_tokens
        )
    for index, (token_ids, _) in enumerate(prompts):
        search, best = await run_beam_search(
            serving,
            f"{response_id}-{index}",
            token_ids,
            beams,
            sampling_params(data, beams.max_tokens, None, serving.sampling_defaults),
            attributes,
            lora_name,
        )
        prompt_tokens += len(token_ids)
        asked = data.return_token_ids
        for beam in best:
            generated = search.generated(beam)
            completion_tokens += len(generated)
            choice = CompletionChoice(
                len(choices),
                beam.text,
                None,
                beam.finish_reason,
                prompt_token_ids=token_ids_if(asked, token_ids),
                token_ids=token_ids_if(asked, generated),
            )
            choices.append(choice)
    usage = Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
    model = serving.response_model(data.model)
    return CompletionResponse(response_id, int(time.time()), model, choices, usage=usage)


def _check_suffix(serving: ServingContext, body: CompletionRequest) -> None:
    """A 400 for a ``suffix`` the model cannot fill in before, or that another field contradicts."""
    if not body.suffix:
        return
    if serving.fim is None:
        message = (
            "suffix needs a model trained to fill in the middle: this model's vocabulary has no "
            "fill-in-the-middle tokens (such as <fim_prefix> or <|fim_prefix|>)"
        )
        raise APIError(400, message, "suffix", "unsupported_parameter")
    if body.echo:
        raise APIError(400, "echo does not combine with suffix", "echo")
    if body.truncate_prompt_tokens is not None:  # it would cut the prompt's markers
        message = "truncate_prompt_tokens does not combine with suffix"
        raise APIError(400, message, "truncate_prompt_tokens")


async def _filled_in(
    serving: ServingContext, body: CompletionRequest, prompts: list[tuple[list[int], str]]
) -> list[tuple[list[int], str]]:
    """Each prompt (its ids without BOS) as the model's fill-in-the-middle prompt before
    ``suffix``, with BOS first where the model wants one (``add_special_tokens``)."""
    after = await encode_text(serving, body.suffix, "suffix", add_special_tokens=False)
    tokenizer = serving.tokenizer
    wants_bos = body.add_special_tokens and tokenizer.add_bos_token
    head = [tokenizer.bos_token_id] if wants_bos and tokenizer.bos_token_id is not None else []
    filled = []
    for before, _ in prompts:
        token_ids = serving.fim.prompt(head, before, after)
        filled.append((token_ids, tokenizer.decode(token_ids, skip_special_tokens=False)))
    return filled


def _best_of(body: CompletionRequest) -> int:
    """How many candidates to generate per prompt (``best_of``, default ``n``); a 400 when it cannot be met."""
    best_of = body.n if body.best_of is None else body.best_of
    if best_of < body.n:
        raise APIError(400, "best_of must be at least n", "best_of")
    if body.stream and best_of != body.n:
        raise APIError(
            400,
            "best_of must equal n when streaming: the best candidates are known only at the end",
            "best_of",
        )
    if body.seed is not None and body.seed + best_of >= INT64:
        raise APIError(400, "seed must fit in a signed 64-bit integer", "seed")
    return best_of


def _scored_prompt_logprobs(body: CompletionRequest) -> int | None:
    """How many top alternatives each prompt token's logprob needs: ``prompt_logprobs``'s, and
    ``logprobs``' when the prompt is echoed with logprobs (as evaluation harnesses score text)."""
    wanted = [body.prompt_logprobs]
    if body.echo and body.logprobs is not None:
        wanted.append(body.logprobs)
    wanted = [n for n in wanted if n is not None]
    return max(wanted) if wanted else None


def best_candidates(finals: list[RequestOutput], best_of: int, n: int) -> list[RequestOutput]:
    """Per prompt (``best_of`` candidates each, in order), the ``n`` with the highest cumulative logprob, best first."""
    chosen = []
    for start in range(0, len(finals), best_of):
        candidates = finals[start : start + best_of]
        ranked = sorted(
            candidates,
            key=lambda o: sum(lp.logprob for lp in o.outputs[0].logprobs or []),
            reverse=True,
        )
        chosen += ranked[:n]
    return chosen


class _CompletionWriter:
    """Builds the response or the stream of chunks for one completions call."""

    def __init__(
        self,
        serving: ServingContext,
        body: CompletionRequest,
        response_id: str,
    ):
        self.serving = serving
        self.model = serving.response_model(body.model)
        self.body = body
        self.id = response_id
        self.created = int(time.time())
        self.names = TokenNames(serving.tokenizer, body.return_tokens_as_token_ids)

    def _logprobs(self, output: RequestOutput, offset: int, first: bool):
        """The legacy logprobs of ``output``'s tokens when asked for; an echoed prompt's first."""
        if self.body.logprobs is None:
            return None
        echoed = None
        if first and self.body.echo:
            echoed = (output.prompt_token_ids, output.prompt_logprobs or [])
        completion = output.outputs[0]
        return completion_logprobs(self.names, completion.logprobs or [], offset, echoed)

    def _prompt_logprobs(self, output: RequestOutput):
        """vLLM's ``prompt_logprobs`` of the choice, when the body asked for them."""
        if self.body.prompt_logprobs is None:
            return None
        return prompt_logprobs(self.names, output.prompt_logprobs)

    def _token_ids(self, output: RequestOutput, first: bool) -> dict:
        """With ``return_token_ids``, a choice's ``token_ids`` (a chunk's: its new ones) and, on its
        first chunk, its ``prompt_token_ids``."""
        asked = self.body.return_token_ids
        return {
            "prompt_token_ids": token_ids_if(asked and first, output.prompt_token_ids),
            "token_ids": token_ids_if(asked, output.outputs[0].token_ids),
        }

    def _echo(self, output: RequestOutput) -> str:
        """The prompt as the engine saw it (``truncate_prompt_tokens`` applied) when echoing."""
        return (output.prompt or "") if self.body.echo else ""

    async def collect(self, group: RequestGroup) -> CompletionResponse:
        """Run every choice to the end and build the full response (with ``best_of``, from the best candidates;
        usage counts every candidate's tokens, as they were all generated)."""
        generated = await group.final_outputs()
        best_of = self.body.best_of or self.body.n
        ordered = (
            generated
            if best_of == self.body.n
            else best_candidates(generated, best_of, self.body.n)
        )
        choices = []
        for index, output in enumerate(ordered):
            completion = output.outputs[0]
            check_finished(completion)
            choices.append(
                CompletionChoice(
                    index,
                    self._echo(output) + completion.text,
                    self._logprobs(output, 0, True),
                    completion.finish_reason,
                    completion.stop_reason,
                    self._prompt_logprobs(output),
                    **self._token_ids(output, True),
                )
            )
        return CompletionResponse(
            self.id,
            self.created,
            self.model,
            choices,
            usage=make_usage(group, best_of),
        )

    async def chunks(self, group: RequestGroup) -> AsyncIterator[CompletionResponse]:
        """One chunk per step that adds text, tokens or a finish reason; a usage chunk when asked."""
        # Each choice's text length so far: where the offsets of its next logprobs start.
        num_chars: dict[int, int] = {}
        continuous = continuous_usage(self.body)
        async for index, output in group.outputs():
            completion = output.outputs[0]
            check_finished(completion)
            first = index not in num_chars
            offset = num_chars.get(index, 0)
            text = (self._echo(output) if first else "") + completion.text
            num_chars[index] = offset + len(text)
            ids = self._token_ids(output, first)
            if not (text or completion.logprobs or ids["token_ids"] or output.finished):
                continue
            logprobs = self._logprobs(output, offset, first)
            finish = completion.finish_reason if output.finished else None
            stop_reason = completion.stop_reason if output.finished else None
            choice = CompletionChoice(
                index,
                text,
                logprobs,
                finish,
                stop_reason,
                self._prompt_logprobs(output) if first else None,
                **ids,
            )
            usage = make_usage(group, self.body.n) if continuous else None
            yield CompletionResponse(self.id, self.created, self.model, [choice], usage=usage)
        options = self.body.stream_options
        if options is not None and options.include_usage:
            usage = make_usage(group, self.body.n)
            yield CompletionResponse(self.id, self.created, self.model, [], usage=usage)
