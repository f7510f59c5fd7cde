"""The offline Python API, vLLM-compatible: ``LLM(...).generate(prompts, sampling_params)``."""

import dataclasses
import itertools
import weakref
from collections.abc import Sequence

from tqdm import tqdm

from spyglass.core.engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from spyglass.core.engine.chat_images import render_with_images, take_images
from spyglass.core.engine.config import EngineConfig, parse_bytes
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.lora_info import LoRARequest
from spyglass.core.engine.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from spyglass.core.engine.pooling_params import PoolingParams, score_pairs
from spyglass.core.engine.prompt_images import images_in_prompt
from spyglass.core.engine.sampling_params import (
    MAX_LOGPROBS,
    InvalidRequestError,
    RequestOutputKind,
    SamplingParams,
    pooling_request_params,
)
from spyglass.core.engine.video_decode import VideoFrames, video_from_frames
from spyglass.core.engine.video_sampling import model_sampling
from spyglass.core.tokenizer import Tokenizer

PromptType = str | dict


class LLM:
    """Generate completions for batches of prompts on one engine, in the caller's thread. An
    `LLM` that is dropped shuts its engine down (`LLMEngine.shutdown`: its metric series are
    removed, its workers stop), as one that goes out of scope should."""

    def __init__(
        self, model: str | None = None, kv_cache_memory: int | str = 2 << 30, **engine_options
    ):
        config = EngineConfig(
            model=model, kv_cache_memory=parse_bytes(kv_cache_memory), **engine_options
        )
        self.engine = LLMEngine(config)
        self._ids = itertools.count()
        # Not at interpreter exit: plugins' exporters may be gone by then.
        weakref.finalize(self, self.engine.shutdown).atexit = False

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` and ``chat`` sample with when given no `SamplingParams`: the model's
        generation_config.json's settings (``generation_config="auto"``, as vLLM), else
        `SamplingParams`' own defaults."""
        return self.engine.sampling_defaults.params()

    def get_tokenizer(self) -> Tokenizer:
        """The model's tokenizer (``encode``, ``decode``, ``apply_chat_template``)."""
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order.

        A prompt is a string, ``{"prompt": ...}`` or ``{"prompt_token_ids": [...]}``, with
        ``"multi_modal_data": {"image": image or [images]}`` (PIL images) for a vision model,
        one image placeholder (``<image>``) in the prompt per image (a Qwen2-VL model's
        ``"video"``: one video, an array ``[frames, height, width, 3]`` or `VideoFrames`, or a list
        of videos, each of those or a list of PIL frames; a ``<|video_pad|>`` per video); ``sampling_params`` is one for
        all prompts or one per prompt, and so is ``lora_request`` (the LoRA adapter to run with,
        loaded the first time its name is seen; needs ``enable_lora=True``). Only the final outputs
        are built (each request's output kind is `RequestOutputKind.FINAL_ONLY`, as in vLLM).
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        if lora_request is None or isinstance(lora_request, LoRARequest):
            lora_request = [lora_request] * len(prompts)
        if len(lora_request) != len(prompts):
            raise ValueError("give one LoRARequest, or one per prompt")
        lora_names = [self._lora_name(r) for r in lora_request]
        groups: list[list[str]] = []
        try:
            for prompt, params, lora_name in zip(prompts, sampling_params, lora_names):
                groups.append(self._add(prompt, params, lora_name))
        except Exception:
            # A rejected prompt rejects the call: drop what was queued, or the next call would run it.
            for req_id in itertools.chain.from_iterable(groups):
                self.engine.abort(req_id)
            raise
        finished = self._run_to_completion(sum(len(g) for g in groups), use_tqdm)
        return [self._merge([finished[req_id] for req_id in group]) for group in groups]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them) and generate.

        A vision model's messages may hold images as content parts: ``{"type": "image_url",
        "image_url": {"url": "data:image/png;base64,..."}}`` or ``{"type": "image_pil",
        "image_pil": image}``. ``continue_final_message`` (with ``add_generation_prompt=False``) has the model carry on
        writing the last message; ``chat_template_kwargs`` are further template variables;
        ``chat_template`` (jinja) renders the conversations instead of the engine's template;
        ``lora_request`` as in `generate`."""
        if add_generation_prompt and continue_final_message:
            raise ValueError("continue_final_message needs add_generation_prompt=False")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tokenizer = self.engine.tokenizer
        if chat_template is not None:
            tokenizer = tokenizer.with_chat_template(chat_template)
        vision = self.engine.arch.vision
        options = {
            "add_generation_prompt": add_generation_prompt,
            "continue_final_message": continue_final_message,
            "template_kwargs": chat_template_kwargs,
        }
        prompts = []
        for conversation in conversations:
            # Images to a model that reads none are refused when the prompt is added.
            plain, media = take_images(
                conversation,
                "messages",
                sampling=model_sampling(self.engine.config.video_frames, vision),
            )
            if vision is None:
                text = tokenizer.apply_chat_template(plain, **options)
            else:
                image_text = tokenizer.decode([vision.placeholder_id], skip_special_tokens=False)
                text = render_with_images(tokenizer, plain, image_text, **options)
            # The template writes BOS where the model wants it: encoding must not add another.
            token_ids = tokenizer.encode(text, add_special_tokens=False)
            prompt = {"prompt": text, "prompt_token_ids": token_ids}
            data = {"image": media.images, "video": media.videos}
            data = {kind: items for kind, items in data.items() if items}
            prompts.append({**prompt, "multi_modal_data": data} if data else prompt)
        return self.generate(prompts, sampling_params, use_tqdm, lora_request)

    def embed(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling_params: PoolingParams | None = None,
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's ``LLM.embed``: each prompt's embedding, in input order (the final norm's output
        at its last token; unit length unless ``pooling_params.normalize`` is off). Prompts as in
        `generate`; a request that fails raises RuntimeError."""
        outputs = self._pool(
            prompts,
            pooling_params or PoolingParams(),
            use_tqdm,
            lora_request,
            truncate_prompt_tokens,
        )
        return [
            EmbeddingRequestOutput(o.request_id, o.prompt_token_ids, EmbeddingOutput(o.pooled))
            for o in outputs
        ]

    def classify(
        self,
        prompts: PromptType | Sequence[PromptType],
        use_tqdm: bool = True,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        truncate_prompt_tokens: int | None = None,
        activation: bool = True,
    ) -> list[ClassificationRequestOutput]:
        """vLLM's ``LLM.classify`` on a sequence classifier (``...ForSequenceClassification``):
        each prompt's class probabilities (softmax; a sigmoid for a single class), in input
        order; with ``activation`` off, the raw logits (a reward model's score)."""
        pooling = PoolingParams(task="classify", activation=activation)
        outputs = self._pool(prompts, pooling, use_tqdm, lora_request, truncate_prompt_tokens)
        return [
            ClassificationRequestOutput(
                o.request_id, o.prompt_token_ids, ClassificationOutput(o.pooled)
            )
            for o in outputs
        ]

    def _pool(
        self,
        prompts: PromptType | Sequence[PromptType],
        pooling: PoolingParams,
        use_tqdm: bool,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
        truncate_prompt_tokens: int | None,
    ) -> list[RequestOutput]:
        """The final outputs of one pooling request per prompt; RuntimeError for one that failed."""
        params = pooling_request_params(pooling, truncate_prompt_tokens)
        outputs = self.generate(prompts, params, use_tqdm, lora_request)
        for output in outputs:
            if output.pooled is None:
                raise RuntimeError(f"pooling request {output.request_id} failed")
        return outputs

    def score(
        self,
        data_1: PromptType | Sequence[PromptType],
        data_2: PromptType | Sequence[PromptType],
        use_tqdm: bool = True,
        lora_request: LoRARequest | None = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's ``LLM.score`` with an embedding model: per pair (one with one, one with many, or
        pairwise), the cosine similarity of the two prompts' embeddings."""
        firsts = [data_1] if isinstance(data_1, (str, dict)) else list(data_1)
        seconds = [data_2] if isinstance(data_2, (str, dict)) else list(data_2)
        pairs = score_pairs(
            list(range(len(firsts))), list(range(len(firsts), len(firsts) + len(seconds)))
        )
        embedded = self.embed(
            firsts + seconds,
            use_tqdm=use_tqdm,
            lora_request=lora_request,
            truncate_prompt_tokens=truncate_prompt_tokens,
        )
        results = []
        for index, (a, b) in enumerate(pairs):
            first, second = embedded[a], embedded[b]
            score = sum(x * y for x, y in zip(first.outputs.embedding, second.outputs.embedding))
            results.append(
                ScoringRequestOutput(
                    str(index),
                    first.prompt_token_ids + second.prompt_token_ids,
                    ScoringOutput(score),
                )
            )
        return results

    def beam_search(
        self, prompts: Sequence[PromptType], params: BeamSearchParams
    ) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: the ``params.beam_width`` best continuations of each prompt,
        best first (`core.engine.beam_search`). Every round runs one token of every live beam of
        every prompt in one batch."""
        tokenizer = self.engine.tokenizer
        searches = [
            BeamSearch(
                self._prompt(prompt)[1], params, tokenizer.eos_token_ids, self.engine.max_model_len
            )
            for prompt in prompts
        ]
        one_token = SamplingParams(
            temperature=0.0,
            max_tokens=1,
            ignore_eos=True,
            logprobs=min(MAX_LOGPROBS, 2 * params.beam_width),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        while live := [s for s in searches if not s.done]:
            req_ids = [
                [self._add_one(beam.tokens, one_token) for beam in search.live] for search in live
            ]
            finished = self._run_to_completion(sum(map(len, req_ids)), use_tqdm=False)
            for search, ids in zip(live, req_ids, strict=True):
                search.advance([finished[i].outputs[0].logprobs[0].top for i in ids])
        outputs = []
        for search in searches:
            best = search.best()
            for beam in best:
                beam.text = tokenizer.decode(search.generated(beam), skip_special_tokens=True)
            outputs.append(BeamSearchOutput(best))
        return outputs

    def _prompt(self, prompt: PromptType) -> tuple[str | None, list[int], tuple[ImageInput, ...]]:
        """A prompt's text (None for token ids alone), token ids and images (placed)."""
        if isinstance(prompt, str):
            return prompt, self.engine.tokenizer.encode(prompt), ()
        if prompt.get("mm_processor_kwargs"):
            raise InvalidRequestError(
                "a prompt's own mm_processor_kwargs are not supported: give the engine's, "
                "LLM(..., mm_processor_kwargs={...})",
                "mm_processor_kwargs",
            )
        text = prompt.get("prompt")
        token_ids = prompt.get("prompt_token_ids")
        token_ids = self.engine.tokenizer.encode(text) if token_ids is None else list(token_ids)
        media = prompt.get("multi_modal_data") or {}
        if set(media) - {"image", "video"}:
            raise InvalidRequestError(
                f"multi_modal_data {sorted(set(media) - {'image', 'video'})}: images and videos "
                "are the only media served",
                "multi_modal_data",
            )
        images = media.get("image") or []
        images = images if isinstance(images, list | tuple) else [images]
        token_ids, placed = images_in_prompt(
            token_ids,
            images,
            self.engine.arch.vision,
            self.engine.max_model_len,
            "multi_modal_data",
            _videos(media.get("video")),
        )
        return text, token_ids, placed

    def _add_one(self, token_ids: list[int], params: SamplingParams) -> str:
        req_id = str(next(self._ids))
        self.engine.add_request(req_id, token_ids, params)
        return req_id

    def _lora_name(self, lora_request: LoRARequest | None) -> str | None:
        """The adapter's name, loaded from its path on first use (a path other than the one the
        name was loaded from is a ValueError)."""
        if lora_request is None:
            return None
        known = {info.name for info in self.engine.loras}
        if lora_request.lora_path or lora_request.lora_name not in known:
            self.engine.add_lora(lora_request.lora_name, lora_request.lora_path)
        return lora_request.lora_name

    def _add(self, prompt: PromptType, params: SamplingParams, lora_name: str | None) -> list[str]:
        text, token_ids, images = self._prompt(prompt)
        base_id = str(next(self._ids))
        req_ids = []
        params = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
        for index in range(params.n):
            req_id = base_id if params.n == 1 else f"{base_id}-{index}"
            sub_params = params
            if params.n > 1:
                seed = None if params.seed is None else params.seed + index
                # The prompt is scored once, by the first choice: the merged output carries it.
                scored = params.prompt_logprobs if index == 0 else None
                sub_params = dataclasses.replace(params, n=1, seed=seed, prompt_logprobs=scored)
            self.engine.add_request(
                req_id, token_ids, sub_params, prompt=text, lora_name=lora_name, images=images
            )
            req_ids.append(req_id)
        return req_ids

    def _run_to_completion(self, total: int, use_tqdm: bool) -> dict[str, RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=total, desc="Generating", disable=not use_tqdm, unit="req") as bar:
            while self.engine.has_unfinished_requests:
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return finished

    @staticmethod
    def _merge(outputs: list[RequestOutput]) -> RequestOutput:
        if len(outputs) == 1:
            return outputs[0]
        first = outputs[0]
        completions = [o.outputs[0] for o in outputs]
        for index, completion in enumerate(completions):
            completion.index = index
        return RequestOutput(
            request_id=first.request_id.rsplit("-", 1)[0],
            prompt=first.prompt,
            prompt_token_ids=first.prompt_token_ids,
            outputs=completions,
            finished=True,
            num_cached_tokens=first.num_cached_tokens,
            prompt_logprobs=first.prompt_logprobs,
        )


def _videos(value) -> list[VideoFrames]:
    """``multi_modal_data``'s videos: one video (`VideoFrames`, or an array of frames), or a list
    of videos (each `VideoFrames`, an array, or a list of PIL frames)."""
    if value is None:
        return []
    videos = list(value) if isinstance(value, list | tuple) else [value]
    return [
        video if isinstance(video, VideoFrames) else video_from_frames(video, "multi_modal_data")
        for video in videos
    ]
