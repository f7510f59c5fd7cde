"""The engine: a step is schedule, run, update. Owns all mutable engine state; not thread-safe by design."""

import dataclasses
import logging
import time
from dataclasses import dataclass, replace

import torch

from spyglass.core.engine.answer_reading import ParserLookup
from spyglass.core.engine.chat_template_option import with_chat_template
from spyglass.core.engine.config import EngineConfig, dtype_name
from spyglass.core.engine.draft_collection import DraftCollection
from spyglass.core.engine.image_inputs import ImageInput
from spyglass.core.engine.kv.block_pool import BlockPool
from spyglass.core.engine.kv.host_memory import keep_freed_memory_mapped
from spyglass.core.engine.kv.kv_cache_manager import KVCacheManager
from spyglass.core.engine.lora_adapters import LoRAAdapters
from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.model_setup import (
    build_runnable_model,
    log_started,
    model_tasks,
    prepare_device_steps,
    prepare_weights,
    warn_if_bf16_is_emulated,
)
from spyglass.core.engine.mrope_positions import prompt_positions
from spyglass.core.engine.output_processor import OutputProcessor
from spyglass.core.engine.output_wire import wire_output
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.plugin_context import PluginContext
from spyglass.core.engine.plugin_manager import SafeHookRelay, create_plugin_manager
from spyglass.core.engine.processor_options import with_processor_options
from spyglass.core.engine.request import FinishReason, Request
from spyglass.core.engine.request_intake import (
    bad_word_token_ids,
    check_images,
    check_min_tokens,
    check_pooling,
    check_prediction,
    output_room,
    pool_range,
    token_constraint,
    truncated_prompt,
)
from spyglass.core.engine.runner.model_runner import (
    FatalRunnerError,
    LaunchedStep,
    ModelRunner,
    RunnerOutput,
)
from spyglass.core.engine.sampling_defaults import read_sampling_defaults
from spyglass.core.engine.sampling_params import InvalidRequestError, SamplingParams
from spyglass.core.engine.sched.image_chunks import check_image_chunks
from spyglass.core.engine.sched.scheduler import Scheduler, SchedulerOutput
from spyglass.core.engine.sched.scheduler_policy import check_policy
from spyglass.core.engine.snapshot import EngineSnapshot, ModelDescription, RequestSnapshot
from spyglass.core.engine.step_stats import EngineInfo, StepStats
from spyglass.core.engine.video_sampling import model_sampling
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.kernels import cpu_isa
from spyglass.kernels.backend import select_backend

log = logging.getLogger("spyglass.engine")


@dataclass(frozen=True, slots=True)
class InFlightStep:
    """A scheduled step whose forward the runner launched: what committing and announcing it need."""

    out: SchedulerOutput
    launched: LaunchedStep
    start: float
    scheduled_time: float
    ahead: bool = False
    """Launched while the step before was on the device (async scheduling)."""


@dataclass(frozen=True, slots=True)
class CommittedStep:
    """A step whose tokens the requests took; its text, outputs and announcement may still be due."""

    step: InFlightStep
    runner_out: RunnerOutput
    progressed: list[Request]
    num_generated: int
    """Output tokens the requests took (a finished or aborted request's are dropped)."""
    commit_time: float


class LLMEngine:
    """Loads a model, owns the KV cache and the queues, and advances every request one step at a time."""

    def __init__(
        self, config: EngineConfig, plugin_manager=None, checkpoint: Checkpoint | None = None
    ):
        # The id and telemetry settings of a given plugin manager's context win: its plugins were made for them.
        known = getattr(plugin_manager, "context", None)
        if known is not None:
            config = replace(config, engine_id=known.engine_id, telemetry=known.telemetry)
        self.context = PluginContext.for_config(config)
        self.config = config = self.context.config
        self.engine_id = self.context.engine_id
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.manual_seed(config.seed)
        # Softmax tails underflow to denormals, which are up to 100x slower on x86 matmuls.
        torch.set_flush_denormal(True)
        keep_freed_memory_mapped()
        self.device = config.torch_device()
        dtype, dtype_reason = config.dtype_choice()
        warn_if_bf16_is_emulated(self.device, dtype)
        self.plugin_manager = plugin_manager or create_plugin_manager(
            config.plugins, config.disabled_plugins, self.context
        )
        self.hooks = SafeHookRelay(self.plugin_manager)
        checkpoint, quantization = prepare_weights(config, dtype, self.device, checkpoint)
        checkpoint = with_processor_options(checkpoint, config.mm_processor_kwargs)
        self.model_name = checkpoint.name
        self.tokenizer = with_chat_template(checkpoint.tokenizer, config.chat_template)
        self.arch = checkpoint.arch
        self.sampling_defaults = read_sampling_defaults(
            config.generation_config, config.model, config.override_generation_config
        )
        # How embeddings pool the prompt: the option's, else the checkpoint's own.
        self.pooling_type = config.pooling_type or checkpoint.arch.pooling_type
        self.backend = select_backend(self.device, config.attention_backend)
        model, runner_class = build_runnable_model(checkpoint, self.backend, self.device, config)
        cache_dtype = config.kv_cache_torch_dtype(dtype, self.device)
        # A tensor-parallel rank 0 holds the most KV heads: its blocks are the largest of any rank's.
        per_block = ModelRunner.bytes_per_block(model.arch, config.block_size, cache_dtype)
        num_blocks = config.num_kv_blocks or max(1, config.kv_cache_memory // per_block)
        self.max_model_len = min(
            config.max_model_len or checkpoint.arch.max_position_embeddings,
            checkpoint.arch.max_position_embeddings,
            num_blocks * config.block_size,
        )
        # A model whose every layer slides frees the blocks that leave the window (see KVCacheManager).
        self.kv = KVCacheManager(
            BlockPool(num_blocks), config.block_size, self.hooks, checkpoint.arch.kv_window()
        )
        self.runner = runner_class(
            model, self.kv.num_cache_blocks, config.block_size, self.device, cache_dtype
        )
        self.lora_adapters: LoRAAdapters | None = None
        if config.enable_lora:
            self.runner.enable_lora()
            self.lora_adapters = LoRAAdapters(
                self.arch, config.max_lora_rank, model.dtype, self.device
            )
            for name, path in config.lora_modules.items():
                self.lora_adapters.load(name, path)
        if checkpoint.arch.vision is not None:
            self.runner.enable_image_cache(config.image_cache_tokens)
        prepare_device_steps(self.runner, config, self.device, self.max_model_len)
        self.async_output, self.async_scheduling = config.async_modes(self.device)
        self._in_flight: InFlightStep | None = None
        self._stopped = False
        policy = self.hooks.spyglass_scheduling_policy(name=config.scheduling_policy, config=config)
        if policy is None:
            raise ValueError(
                f"no plugin provides the scheduling policy {config.scheduling_policy!r}"
            )
        self.scheduler = Scheduler(
            config,
            self.kv,
            check_policy(policy, config.scheduling_policy),
            self.hooks.count_error,
            whole_images=check_image_chunks(self.arch.vision, config.max_num_batched_tokens),
        )
        self.outputs = OutputProcessor(
            self.scheduler,
            self.kv,
            self.hooks,
            self.tokenizer,
            self.max_model_len,
            config.stream_interval,
        )
        self.drafts = (
            DraftCollection(
                self.hooks,
                config.speculative,
                config.num_speculative_tokens,
                self.arch.vocab_size,
                self.max_model_len,
            )
            if config.speculative
            else None
        )
        self.info = EngineInfo(
            model_name=self.model_name,
            engine_id=self.engine_id,
            device=str(self.device),
            dtype=dtype_name(dtype),
            num_kv_blocks=num_blocks,
            block_size=config.block_size,
            max_model_len=self.max_model_len,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            attention_backend=self.backend.name,
            vocab_size=checkpoint.arch.vocab_size,
            waiting_classes=tuple(getattr(policy, "waiting_classes", ())),
            tensor_parallel_size=config.tensor_parallel_size,
            kv_cache_dtype=dtype_name(cache_dtype),
            kernels=cpu_isa.describe() if self.device.type == "cpu" else "cuda",
            quantization=quantization,
            async_output=self.async_output,
            async_scheduling=self.async_scheduling,
            stream_interval=config.stream_interval,
            tasks=model_tasks(self.arch),
            pooling_type=self.pooling_type,
            tokenizer=self.tokenizer,
            hook_errors=self.hooks.num_errors,
            parsers=ParserLookup(
                lambda name: self.hooks.spyglass_tool_call_parser(name=name),
                lambda name: self.hooks.spyglass_reasoning_parser(name=name),
            ),
        )
        log_started(self.info, dtype_reason, checkpoint.weights, config.block_size)
        if config.mm_processor_kwargs:
            log.info(
                "image processor options (mm_processor_kwargs): %s", config.mm_processor_kwargs
            )
        if config.media_io_kwargs:
            log.info("media reading options (media_io_kwargs): %s", config.media_io_kwargs)
        if config.chat_template is not None:
            log.info("chat template (--chat-template): %s", config.chat_template[:200])
        if self.sampling_defaults.changed():
            # As vLLM warns: requests that leave these out do not get the API's defaults.
            log.info(
                "sampling defaults from %s: %s",
                self.sampling_defaults.source,
                self.sampling_defaults.changed(),
            )
        self.hooks.spyglass_engine_started(info=self.info, config=config)
        if (
            config.speculative
            and self.hooks.spyglass_propose_drafts(
                method=config.speculative,
                requests=(),
                num_speculative_tokens=config.num_speculative_tokens,
            )
            is None
        ):
            self.hooks.spyglass_engine_stopped(
                info=self.info
            )  # what the start hooks built (a draft engine) goes
            raise ValueError(
                f"no plugin provides the draft proposer {config.speculative!r} (--speculative)"
            )

    # -- requests -------------------------------------------------------------------------------

    def add_request(
        self,
        req_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        prompt: str | None = None,
        attributes: dict | None = None,
        lora_name: str | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> Request:
        """Validate and queue a request; raises `InvalidRequestError` for one that can never run.

        A prompt longer than ``params.truncate_prompt_tokens`` loses its first tokens (its text
        is then that of the tokens kept). ``lora_name`` runs it with that loaded LoRA adapter.
        ``images`` are a vision model's prompt's (`image_inputs.place_images` placed them)."""
        check_pooling(params, self.arch, self.pooling_type, self.config.tensor_parallel_size)
        check_images(
            prompt_token_ids,
            images,
            self.arch.vision,
            params,
            self.max_model_len,
            self.config.limit_mm_per_prompt,
        )
        lora = None
        if lora_name is not None:
            if self.lora_adapters is None:
                raise InvalidRequestError(
                    "LoRA adapters are off on this engine (--enable-lora)", "model"
                )
            lora = self.lora_adapters.get(lora_name)
        prompt_token_ids, prompt = truncated_prompt(
            prompt_token_ids, prompt, params, self.max_model_len, self.tokenizer
        )
        room = output_room(
            req_id,
            prompt_token_ids,
            params,
            self.requests,
            self.arch.vocab_size,
            self.max_model_len,
        )
        request = Request(
            req_id,
            prompt_token_ids,
            params,
            prompt=prompt,
            max_tokens=params.max_tokens or room,
            eos_token_ids=() if params.ignore_eos else self.tokenizer.eos_token_ids,
            attributes=attributes,
            images=images,
        )
        request.lora = lora
        if images and self.arch.uses_mrope:
            request.rope_positions = prompt_positions(
                len(prompt_token_ids), images, self.arch.vision
            )
        request.pool_range = pool_range(params, self.pooling_type, len(prompt_token_ids))
        check_min_tokens(params, request.eos_token_ids)
        check_prediction(params, self.config.speculative)
        request.bad_word_ids = bad_word_token_ids(self.tokenizer, params.bad_words or [])
        if params.structured_output is not None:
            request.constraint = token_constraint(
                self.hooks,
                params.structured_output,
                self.tokenizer,
                self.arch.vocab_size,
                params.allowed_token_ids,
            )
        self.outputs.add(request)
        self.scheduler.add(request)
        self.hooks.spyglass_request_added(request=request)
        return request

    def add_lora(self, name: str, path: str) -> LoRAInfo:
        """Load the PEFT adapter at ``path`` under ``name`` for requests to use; ValueError when it
        cannot run on this model or LoRA is off."""
        if self.lora_adapters is None:
            raise ValueError("LoRA adapters are off on this engine (--enable-lora)")
        return self.lora_adapters.load(name, path)

    def remove_lora(self, name: str) -> None:
        """Unload ``name``: new requests cannot use it, running ones finish with it."""
        if self.lora_adapters is None:
            raise ValueError("LoRA adapters are off on this engine (--enable-lora)")
        self.lora_adapters.unload(name)

    @property
    def loras(self) -> tuple[LoRAInfo, ...]:
        """The loaded LoRA adapters (none when LoRA is off)."""
        return () if self.lora_adapters is None else self.lora_adapters.infos()

    @property
    def requests(self) -> dict[str, Request]:
        """The live requests by id (waiting, running or preempted)."""
        return self.outputs.requests

    def abort(self, req_id: str) -> RequestOutput | None:
        """Abort a request if it is still alive, freeing its blocks; returns its final output."""
        request = self.requests.get(req_id)
        if request is None:
            return None
        self.outputs.finish(request, FinishReason.ABORT)
        return self.outputs.output(request)

    @property
    def has_unfinished_requests(self) -> bool:
        """True while any request waits or runs, or is in a launched step not yet collected (a step
        whose requests were all aborted meanwhile is collected with the next one)."""
        in_flight = self._in_flight
        return self.scheduler.has_work or (
            in_flight is not None
            and not all(s.request.is_finished for s in in_flight.out.scheduled)
        )

    # -- the step -------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model, update requests; returns outputs of requests that progressed or ended.

        With ``async_output`` the device's work on one step overlaps the host's on the one before:
        a call first waits for the step the previous call launched and commits its tokens (the
        finishes by EOS, stop token, stop string and length: all that scheduling reads), schedules
        and launches the next step, and only then detokenizes, builds the outputs and announces the
        collected step, while the device runs the new one. With ``async_scheduling`` the next step
        is also scheduled and launched before the previous one is collected (`_step_ahead`); a
        grammar's request is sampled once its pending token is committed. Tokens are the same
        either way.
        """
        in_flight = self._in_flight
        # With async scheduling the next step is planned before the one in flight's tokens are on
        # the host: every request needs only its new token's id (on the device) for the next step.
        # Penalties count it on the device, bad words compare it there, min_tokens only counts it,
        # logprobs, prompt scores and pooled answers follow it to the host, and a grammar's
        # request has its next token sampled once the token is accepted
        # (`ModelRunner.sample_deferred`): the forward is queued before.
        if in_flight is not None and self.async_scheduling:
            return self._step_ahead(in_flight)
        outputs, collected = self._collect_in_flight()
        start = time.perf_counter()
        out, failed = self._schedule()
        launched, failure = None, None
        if not out.is_empty:
            scheduled_time = time.perf_counter()
            if not self.async_output:
                self._announce_start(out)
            try:
                launched = self._launch(out)
            except FatalRunnerError:
                raise
            except Exception as error:
                failure = error
        if collected is not None:
            outputs += self._emit(collected)
        if out.is_empty:
            return failed + outputs
        if self.async_output:
            # After the previous step's announcement: a step's start and finish never interleave
            # with another's.
            self._announce_start(out)
        if failure is not None:
            return failed + outputs + self._isolate_failure(out, failure)
        step = InFlightStep(out, launched, start, scheduled_time)
        if self.async_output:
            self._in_flight = step
            return failed + outputs
        committed = self._commit(step)
        return (
            failed + outputs + (committed if isinstance(committed, list) else self._emit(committed))
        )

    def _step_ahead(self, in_flight: InFlightStep) -> list[RequestOutput]:
        """Schedule and launch the next step while ``in_flight`` runs (each pending token read on the
        device), then commit and emit ``in_flight``: the device always has a step queued."""
        start = time.perf_counter()
        out, failed = self._schedule()
        launched, failure, scheduled_time = None, None, start
        if not out.is_empty:
            scheduled_time = time.perf_counter()
            try:
                # Counted in flight once the step before it is committed (its reruns, were it to
                # fail, must not start after this one).
                launched = self.runner.launch(out, self.kv.block_tables, in_flight.launched)
            except FatalRunnerError:
                raise
            except Exception as error:
                failure = error
        self._in_flight = None
        committed = self._commit(in_flight)
        if isinstance(committed, list):
            # The step ahead read the failed step's token ids: it is dropped, its requests run again.
            return failed + committed
        if launched is not None and launched.unsampled is not None:
            # Its grammars have now accepted their pending tokens: their masks can be filled.
            try:
                launched = self.runner.sample_deferred(launched)
            except FatalRunnerError:
                raise
            except Exception as error:
                launched, failure = None, error
        if launched is not None:
            self._count_in_flight(out, launched, 1)
        outputs = failed + self._emit(committed)
        if out.is_empty:
            return outputs
        self._announce_start(out)
        if failure is not None:
            return outputs + self._isolate_failure(out, failure)
        self._in_flight = InFlightStep(out, launched, start, scheduled_time, ahead=True)
        return outputs

    def _launch(self, out: SchedulerOutput) -> LaunchedStep:
        """Launch a step on the runner and count its tokens in flight until they are committed."""
        launched = self.runner.launch(out, self.kv.block_tables)
        self._count_in_flight(out, launched, 1)
        return launched

    @staticmethod
    def _count_in_flight(out: SchedulerOutput, launched: LaunchedStep, sign: int) -> None:
        """Count a launched step's tokens in flight (``sign`` 1), or uncount them (-1: a step that
        will never be committed)."""
        for scheduled, sampled in zip(out.scheduled, launched.sampled_rows):
            scheduled.request.num_in_flight_tokens += sign * scheduled.num_new_tokens
            scheduled.request.num_pending_tokens += sign * sampled

    def _collect_in_flight(self) -> tuple[list[RequestOutput], CommittedStep | None]:
        """Commit the step the previous call launched: to emit after the next launch; or, when it
        failed on the device, the outputs of its one-request reruns."""
        step, self._in_flight = self._in_flight, None
        if step is None:
            return [], None
        committed = self._commit(step)
        return (committed, None) if isinstance(committed, list) else ([], committed)

    def _schedule(self) -> tuple[SchedulerOutput, list[RequestOutput]]:
        """Drafts, the scheduler's plan and its announcements; the final outputs of requests that a
        plugin's decision failed."""
        if self.drafts is not None:
            self.drafts.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        failed = [self.outputs.fail(request, error) for request, error in out.failed]
        for request in out.preempted:
            self.hooks.spyglass_request_preempted(request=request)
        now = time.monotonic()
        for request in out.admitted + out.resumed:
            if not request.times.first_scheduled:
                request.times.first_scheduled = now
            self.hooks.spyglass_request_scheduled(request=request, resumed=request in out.resumed)
        return out, failed

    def _announce_start(self, out: SchedulerOutput) -> None:
        """The step's start, naming its requests still alive (one scheduled ahead may carry a request
        that the commit before it finished)."""
        self.hooks.spyglass_step_started(
            step_id=out.step_id,
            scheduled=tuple(s.request for s in out.scheduled if not s.request.is_finished),
        )

    def _commit(self, step: InFlightStep) -> CommittedStep | list[RequestOutput]:
        """Wait for a launched step and commit its tokens; a step that failed on the device is rerun
        one request at a time instead (those outputs)."""
        try:
            runner_out = self.runner.collect(step.launched)
        except FatalRunnerError:
            raise
        except Exception as error:
            self._count_in_flight(step.out, step.launched, -1)
            return self._isolate_failure(step.out, error)
        commit_start = time.perf_counter()
        progressed, num_generated = self.outputs.commit_tokens(step.out, runner_out)
        return CommittedStep(
            step,
            runner_out,
            progressed,
            num_generated,
            time.perf_counter() - commit_start,
        )

    def _emit(self, committed: CommittedStep) -> list[RequestOutput]:
        """The outputs of a committed step's requests (their text), and its announcement."""
        emit_start = time.perf_counter()
        outputs = self.outputs.emit(committed.progressed)
        end = time.perf_counter()
        step = committed.step
        stats = self._stats(
            step,
            committed.runner_out,
            committed.num_generated,
            committed.commit_time + end - emit_start,
            end,
        )
        self.hooks.spyglass_step_finished(stats=stats)
        return outputs

    def _isolate_failure(self, out: SchedulerOutput, error: Exception) -> list[RequestOutput]:
        """A failed step is rerun one request at a time, so that only the requests that fail alone fail.

        Nothing was committed by the failed step (computed counts advance at a commit), so the
        reruns recompute the same tokens; one poisoned request thus cannot take its batch with it.
        """
        log.warning(
            "model step %d failed with %d requests", out.step_id, len(out.scheduled), exc_info=error
        )
        # A step scheduled ahead may carry requests that the commit before it finished.
        alive = tuple(s for s in out.scheduled if not s.request.is_finished)
        out = dataclasses.replace(out, scheduled=alive)
        if len(alive) <= 1:
            return self.outputs.fail_step(out, error)
        outputs = []
        for scheduled in alive:
            solo = dataclasses.replace(out, scheduled=(scheduled,))
            try:
                runner_out = self.runner.collect(self._launch(solo))
            except Exception as solo_error:
                outputs += self.outputs.fail_step(solo, solo_error)
                continue
            outputs += self.outputs.update(solo, runner_out)
        return outputs

    def _stats(
        self,
        step: InFlightStep,
        runner_out: RunnerOutput,
        num_generated: int,
        update_time: float,
        end: float,
    ) -> StepStats:
        out, graph = step.out, runner_out.graph
        num_prefill = sum(1 for s in out.scheduled if s.num_new_tokens > 1 + s.num_spec_tokens)
        return StepStats(
            step_id=out.step_id,
            req_ids=tuple(s.request.req_id for s in out.scheduled),
            num_prefill_reqs=num_prefill,
            num_decode_reqs=len(out.scheduled) - num_prefill,
            num_scheduled_tokens=out.num_scheduled_tokens,
            num_prefill_tokens=sum(
                s.num_new_tokens for s in out.scheduled if s.num_new_tokens > 1 + s.num_spec_tokens
            ),
            num_generated_tokens=num_generated,
            num_preempted=len(out.preempted),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.kv.pool.usage,
            num_free_blocks=self.kv.pool.num_free_blocks,
            schedule_time=step.scheduled_time - step.start,
            model_time=runner_out.model_time,
            update_time=update_time,
            start_time=step.start,
            end_time=end,
            waiting_by_class=self.scheduler.waiting_by_class(),
            tensor_parallel_size=self.config.tensor_parallel_size,
            mask_time=runner_out.mask_time,
            num_images_encoded=runner_out.vision.num_images,
            num_images_cached=runner_out.vision.num_images_cached,
            vision_time=runner_out.vision.seconds,
            num_image_waits=out.num_image_waits,
            scheduled_ahead=step.ahead,
            forward="eager" if graph is None else f"graph_{graph.kind}",
            graph_tokens=0 if graph is None else graph.tokens,
        )

    def send_wire_outputs(self) -> None:
        """From now on `step`, `abort` and `abort_all` give `WireOutput` rows (`output_wire`) in
        place of `RequestOutput`s: what the engine's own process sends to the server, built without
        an object per request per step."""
        self.outputs.build = wire_output

    def abort_all(self) -> list[RequestOutput]:
        """Abort every live request; their final outputs."""
        return [
            output for req_id in list(self.requests) if (output := self.abort(req_id)) is not None
        ]

    def shutdown(self) -> None:
        """Abort whatever is left and announce the stop (once: later calls do nothing)."""
        if self._stopped:
            return
        self._stopped = True
        self.abort_all()
        self.hooks.spyglass_engine_stopped(info=self.info)
        self.runner.close()

    # -- queries --------------------------------------------------------------------------------

    def snapshot(self, with_requests: bool = False) -> EngineSnapshot:
        """Queue lengths and KV usage now, and with ``with_requests`` every live request's state."""
        pool = self.kv.pool
        return EngineSnapshot(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            num_requests=len(self.requests),
            num_blocks=pool.num_blocks,
            num_free_blocks=pool.num_free_blocks,
            requests=tuple(map(self._request_snapshot, self.requests.values()))
            if with_requests
            else (),
        )

    def describe(self) -> ModelDescription:
        """What this engine serves."""
        return ModelDescription(
            self.model_name,
            self.max_model_len,
            self.arch.vocab_size,
            lora_enabled=self.lora_adapters is not None,
            loras=self.loras,
            labels=self.arch.labels,
            vision=self.arch.vision,
            max_images_per_prompt=self.config.limit_mm_per_prompt.get("image"),
            max_videos_per_prompt=self.config.limit_mm_per_prompt.get("video"),
            video_sampling=model_sampling(self.config.video_frames, self.arch.vision),
            sampling_defaults=self.sampling_defaults,
            orders_by_priority=getattr(self.scheduler.policy, "reads_priority", False),
        )

    def _request_snapshot(self, request: Request) -> RequestSnapshot:
        return RequestSnapshot(
            request_id=request.req_id,
            status=request.status.value,
            num_prompt_tokens=request.num_prompt_tokens,
            num_output_tokens=request.num_output_tokens,
            num_computed_tokens=request.num_computed_tokens,
            num_cached_tokens=request.num_cached_tokens,
            num_blocks=self.kv.num_held_blocks(request.req_id),
            num_preemptions=request.num_preemptions,
            arrival_time=request.times.arrival,
            lora_name=request.lora_name,
            num_images=len(request.images),
            priority=request.sampling_params.priority,
        )
