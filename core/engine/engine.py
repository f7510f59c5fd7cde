"""The engine: a step is schedule, run, update. Owns all mutable engine state; not thread-safe by design."""

import dataclasses
import logging
import time
from dataclasses import dataclass, replace

import torch

from spyglass.core.engine.config import EngineConfig, dtype_name
from spyglass.core.engine.detokenizer import IncrementalDetokenizer
from spyglass.core.engine.kv.block_pool import BlockPool
from spyglass.core.engine.kv.host_memory import keep_freed_memory_mapped
from spyglass.core.engine.kv.kv_cache_manager import KVCacheManager
from spyglass.core.engine.outputs import CompletionOutput, RequestOutput
from spyglass.core.engine.plugin_context import PluginContext
from spyglass.core.engine.plugin_manager import SafeHookRelay, create_plugin_manager
from spyglass.core.engine.request import FinishReason, Request, RequestStatus
from spyglass.core.engine.runner.model_runner import (
    FatalRunnerError,
    LaunchedStep,
    ModelRunner,
    RunnerOutput,
)
from spyglass.core.engine.sampling_params import (
    InvalidRequestError,
    SamplingParams,
    StructuredOutput,
)
from spyglass.core.engine.sched.scheduler import Scheduler, SchedulerOutput
from spyglass.core.engine.sched.scheduler_policy import check_policy
from spyglass.core.engine.snapshot import EngineSnapshot, ModelDescription, RequestSnapshot
from spyglass.core.engine.step_stats import EngineInfo, StepStats
from spyglass.core.engine.token_constraint import TokenConstraint, allowed_tokens, fill_rows
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.models.linear import DualLinear
from spyglass.core.models.quantization import (
    check_dense_copies,
    quantize_weights_int8,
    resolve_mode,
    weight_bytes,
    with_dense_copies,
)
from spyglass.core.models.registry import build_model
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


@dataclass(frozen=True, slots=True)
class CommittedStep:
    """A step whose tokens the requests took; its text, outputs and announcement may still be due."""

    step: InFlightStep
    runner_out: RunnerOutput
    progressed: list[Request]
    num_generated: int
    """Output tokens the requests took (a finished or aborted request's are dropped)."""
    deferred: list[tuple[IncrementalDetokenizer, int]]
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
        if self.device.type == "cpu" and dtype == torch.bfloat16 and not cpu_isa.has_native_bf16():
            log.warning(
                "bfloat16 asked for, but this CPU (%s) has no native bf16 arithmetic: it is emulated and several "
                "times slower than --dtype float32",
                cpu_isa.describe(),
            )
        self.plugin_manager = plugin_manager or create_plugin_manager(
            config.plugins, config.disabled_plugins, self.context
        )
        self.hooks = SafeHookRelay(self.plugin_manager)
        quantization = resolve_mode(config.quantization, self.device)
        checkpoint = checkpoint or load_checkpoint(
            config.model, dtype, keep_quantized=quantization in ("auto", "dual")
        )
        if quantization == "int8":
            checkpoint = replace(checkpoint, weights=quantize_weights_int8(checkpoint.weights))
        elif quantization == "dual":
            if config.tensor_parallel_size > 1:
                raise ValueError("--quantization dual does not combine with tensor parallelism")
            check_dense_copies(checkpoint.weights, dtype)
            checkpoint = replace(checkpoint, weights=with_dense_copies(checkpoint.weights, dtype))
        self.model_name = checkpoint.name
        self.tokenizer = checkpoint.tokenizer
        self.arch = checkpoint.arch
        self.backend = select_backend(self.device, config.attention_backend)
        # imported here: torch.distributed would slow every other start
        if config.tensor_parallel_size > 1:
            from spyglass.core.engine.runner.parallel import (
                ParallelModelRunner,
                launch_tensor_parallel,
            )

            model = launch_tensor_parallel(checkpoint, self.backend, self.device, config)
            runner_class = ParallelModelRunner
        else:
            model = build_model(checkpoint.arch, checkpoint.weights, self.backend, self.device)
            runner_class = ModelRunner
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
        if self.device.type == "cuda" and config.tensor_parallel_size == 1:
            seconds = self.runner.compile_kernels(config.max_num_batched_tokens, self.max_model_len)
            log.info("kernels compiled for every step shape in %.2f s", seconds)
        if config.cuda_graphs and self.device.type == "cuda":
            # Verify steps (a token and its drafts per request) get graphs of their own.
            rows = (1, 1 + config.num_speculative_tokens) if config.speculative else (1,)
            seconds = self.runner.enable_cuda_graphs(config.max_num_seqs, self.max_model_len, rows)
            log.info("CUDA graph capture took %.2f s", seconds)
        # Emitting a step while the next one runs pays where the device runs apart from the host.
        # Async scheduling emits while the next step runs, so it brings async output unless refused.
        self.async_output = (
            self.device.type == "cuda" or config.async_scheduling
            if config.async_output is None
            else config.async_output
        )
        if config.async_scheduling and not self.async_output:
            raise ValueError("--async-scheduling needs async output (drop --no-async-output)")
        if config.async_scheduling and config.speculative:
            raise ValueError(
                "--async-scheduling does not combine with --speculative: drafts need the last token"
            )
        self.async_scheduling = config.async_scheduling
        self._in_flight: InFlightStep | None = None
        policy = self.hooks.spyglass_scheduling_policy(name=config.scheduling_policy, config=config)
        if policy is None:
            raise ValueError(
                f"no plugin provides the scheduling policy {config.scheduling_policy!r}"
            )
        self.scheduler = Scheduler(
            config, self.kv, check_policy(policy, config.scheduling_policy), self.hooks.count_error
        )
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
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
            tokenizer=self.tokenizer,
            hook_errors=self.hooks.num_errors,
        )
        log.info(
            "engine started: %s on %s (%s), %s (%s), weights %.0f MB (quantization %s), kernels %s, "
            "%d KV blocks of %d tokens (%s), async output %s, async scheduling %s",
            self.model_name,
            self.info.device,
            self.info.kernels,
            self.info.dtype,
            dtype_reason,
            weight_bytes(checkpoint.weights) / 1e6,
            f"dual: blocks below {DualLinear.DENSE_FROM_ROWS} rows, bf16 from there"
            if quantization == "dual"
            else quantization,
            self.backend.name,
            num_blocks,
            config.block_size,
            self.info.kv_cache_dtype,
            "on" if self.async_output else "off",
            "on" if self.async_scheduling else "off",
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
    ) -> Request:
        """Validate and queue a request; raises `InvalidRequestError` for one that can never run."""
        if req_id in self.requests:
            raise InvalidRequestError(f"request id {req_id!r} is already in use", "request_id")
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty", "prompt")
        if max(prompt_token_ids) >= self.arch.vocab_size or min(prompt_token_ids) < 0:
            raise InvalidRequestError("the prompt has token ids outside the vocabulary", "prompt")
        if params.logit_bias and not all(
            0 <= token < self.arch.vocab_size for token in params.logit_bias
        ):
            raise InvalidRequestError(
                "logit_bias names token ids outside the vocabulary", "logit_bias"
            )
        room = self.max_model_len - len(prompt_token_ids)
        if room < 1 or (params.max_tokens is not None and params.max_tokens > room):
            raise InvalidRequestError(
                f"the prompt ({len(prompt_token_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"the model's context of {self.max_model_len} tokens",
                "max_tokens",
            )
        request = Request(
            req_id,
            prompt_token_ids,
            params,
            prompt=prompt,
            max_tokens=params.max_tokens or room,
            eos_token_ids=() if params.ignore_eos else self.tokenizer.eos_token_ids,
            attributes=attributes,
        )
        if params.structured_output is not None:
            request.constraint = self._token_constraint(params.structured_output)
        self.requests[req_id] = request
        self.detokenizers[req_id] = IncrementalDetokenizer(
            self.tokenizer, prompt_token_ids, params.stop
        )
        self.scheduler.add(request)
        self.hooks.spyglass_request_added(request=request)
        return request

    def _token_constraint(self, spec: StructuredOutput) -> TokenConstraint:
        """A fresh grammar matcher for ``spec`` from the plugins; `InvalidRequestError` when none can enforce it."""
        try:
            constraint = self.hooks.spyglass_token_constraint(
                spec=spec, tokenizer=self.tokenizer, vocab_size=self.arch.vocab_size
            )
        except ValueError as error:
            raise InvalidRequestError(f"invalid {spec.kind}: {error}", "response_format") from error
        if constraint is None:
            raise InvalidRequestError(
                "structured output needs a token-constraint plugin, and none is enabled",
                "response_format",
            )
        first = allowed_tokens(fill_rows([constraint], self.arch.vocab_size), self.arch.vocab_size)[
            0
        ]
        if not any(
            constraint.num_valid([token]) for token in first.nonzero().flatten().tolist()[:64]
        ):
            # e.g. a choice whose first character this vocabulary cannot spell (byte tokens are missing)
            raise InvalidRequestError(
                f"no token of this model's vocabulary can start an output matching the {spec.kind}",
                "response_format",
            )
        return constraint

    def abort(self, req_id: str) -> RequestOutput | None:
        """Abort a request if it is still alive, freeing its blocks; returns its final output."""
        request = self.requests.get(req_id)
        if request is None:
            return None
        self._finish(request, FinishReason.ABORT)
        return self._output(request)

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
        is also scheduled and launched before the previous one is collected (`_step_ahead`), when
        that one's sampled requests need nothing of their new token but its id. Tokens are the same
        either way.
        """
        in_flight = self._in_flight
        if in_flight is not None and self._schedules_ahead_of(in_flight):
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

    def _schedules_ahead_of(self, in_flight: InFlightStep) -> bool:
        """Whether the next step may be planned before ``in_flight``'s tokens are on the host: with
        async scheduling, when every request it samples needs only its new token's id (on the
        device) for the next step. Grammars, penalties and logprobs need the token on the host."""
        if not self.async_scheduling or in_flight.launched.result is not None:
            return False
        return all(
            s.request.constraint is None
            and not s.request.sampling_params.has_penalties
            and s.request.logprobs is None
            for s, sampled in zip(in_flight.out.scheduled, in_flight.launched.sampled_rows)
            if sampled
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
        if launched is not None:
            self._count_in_flight(out, launched, 1)
        outputs = failed + self._emit(committed)
        if out.is_empty:
            return outputs
        self._announce_start(out)
        if failure is not None:
            return outputs + self._isolate_failure(out, failure)
        self._in_flight = InFlightStep(out, launched, start, scheduled_time)
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
        if self.config.speculative:
            self._propose_drafts()
        out = self.scheduler.schedule()
        failed = [self._fail_request(request, error) for request, error in out.failed]
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
        deferred: list[tuple[IncrementalDetokenizer, int]] = []
        progressed, num_generated = self._commit_tokens(
            step.out, runner_out, deferred if self.async_output else None
        )
        return CommittedStep(
            step,
            runner_out,
            progressed,
            num_generated,
            deferred,
            time.perf_counter() - commit_start,
        )

    def _emit(self, committed: CommittedStep) -> list[RequestOutput]:
        """The deferred text, the outputs of a committed step's requests, and its announcement."""
        emit_start = time.perf_counter()
        for detokenizer, token_id in committed.deferred:
            detokenizer.add_token(token_id)
        # A request the scheduler failed since its tokens were committed has had its final output.
        outputs = [self._output(r) for r in committed.progressed if r.req_id in self.detokenizers]
        end = time.perf_counter()
        step = committed.step
        stats = self._stats(
            step.out,
            committed.runner_out,
            committed.num_generated,
            step.start,
            step.scheduled_time,
            committed.commit_time + end - emit_start,
            end,
        )
        self.hooks.spyglass_step_finished(stats=stats)
        return outputs

    def _update(self, out: SchedulerOutput, runner_out: RunnerOutput) -> list[RequestOutput]:
        return [self._output(r) for r in self._commit_tokens(out, runner_out, None)[0]]

    def _commit_tokens(
        self,
        out: SchedulerOutput,
        runner_out: RunnerOutput,
        deferred: list[tuple[IncrementalDetokenizer, int]] | None,
    ) -> tuple[list[Request], int]:
        """Advance each scheduled request by its sampled tokens; the requests that progressed or
        ended, and the tokens they took. With ``deferred``, text that cannot end a request (it has
        no stop strings) is left there for later.

        A request preempted since the step's launch (async scheduling) keeps its new token, but not
        the computed count: it is recomputed from its first token."""
        progressed = []
        num_generated = 0
        now = time.monotonic()
        for scheduled, token_ids, logprobs in zip(
            out.scheduled, runner_out.sampled_token_ids, runner_out.logprobs
        ):
            request = scheduled.request
            request.num_in_flight_tokens -= scheduled.num_new_tokens
            request.num_pending_tokens -= bool(token_ids)
            if request.is_finished:
                continue
            if request.status is RequestStatus.RUNNING:
                request.num_computed_tokens += scheduled.num_new_tokens
                if scheduled.num_spec_tokens:
                    self._settle_drafts(request, scheduled.num_spec_tokens, len(token_ids) - 1)
                self.kv.announce_full_blocks(request)
            if not token_ids:
                continue
            before = request.num_output_tokens
            for token_id, logprob in zip(token_ids, logprobs):
                self._append_token(request, token_id, logprob, now, deferred)
                if request.is_finished:
                    break
            num_generated += request.num_output_tokens - before
            progressed.append(request)
        return progressed, num_generated

    def _propose_drafts(self) -> None:
        """Ask proposer plugins for drafts for the decoding requests that allow speculation."""
        candidates = tuple(
            r
            for r in self.scheduler.running
            if r.num_computed_tokens == r.num_tokens - 1
            and r.sampling_params.speculative
            and not r.sampling_params.has_penalties
            and r.logprobs is None
        )
        if not candidates:
            return
        k = self.config.num_speculative_tokens
        try:
            proposals = (
                self.hooks.spyglass_propose_drafts(
                    method=self.config.speculative, requests=candidates, num_speculative_tokens=k
                )
                or {}
            )
        except Exception:
            # Drafts are an optimisation: without them every request simply decodes one token.
            self.hooks.count_error(self.config.speculative, "spyglass_propose_drafts")
            log.exception(
                "draft proposer %r failed; decoding without drafts this step",
                self.config.speculative,
            )
            return
        for request in candidates:
            room = min(
                k,
                request.max_tokens - request.num_output_tokens - 1,
                self.max_model_len - request.num_tokens - 1,
            )
            drafts = self._valid_drafts(proposals.get(request.req_id, ()))[: max(room, 0)]
            if request.constraint is not None:
                # Only drafts the grammar allows are verified: the verifier masks by grammar position.
                drafts = drafts[: request.constraint.num_valid(drafts)]
            request.spec_token_ids = drafts

    def _valid_drafts(self, drafts) -> list[int]:
        """The drafts up to the first one that is not a token id of this vocabulary (counted as a hook error)."""
        valid = []
        for token_id in drafts:
            if type(token_id) is not int or not 0 <= token_id < self.arch.vocab_size:
                self.hooks.count_error(self.config.speculative, "spyglass_propose_drafts")
                log.warning(
                    "draft proposer %r proposed %r, not a token id; drafts cut there",
                    self.config.speculative,
                    token_id,
                )
                break
            valid.append(token_id)
        return valid

    def _settle_drafts(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """Roll the computed count back past rejected drafts (their KV slots are simply overwritten later)."""
        request.num_computed_tokens -= num_drafts - num_accepted
        request.spec_token_ids = []
        request.num_spec_steps += 1
        request.num_draft_tokens += num_drafts
        request.num_accepted_tokens += num_accepted
        self.hooks.spyglass_drafts_verified(
            request=request, num_draft_tokens=num_drafts, num_accepted_tokens=num_accepted
        )

    def _append_token(
        self,
        request: Request,
        token_id: int,
        logprob,
        now: float,
        deferred: list[tuple[IncrementalDetokenizer, int]] | None = None,
    ) -> None:
        if request.constraint is not None and not request.constraint.accept(token_id):
            self._finish(
                request, FinishReason.ERROR, f"the grammar rejected sampled token {token_id}"
            )
            return
        request.output_token_ids.append(token_id)
        if request.logprobs is not None:
            request.logprobs.append(logprob)
        request.times.last_token = now
        if request.num_output_tokens == 1:
            request.times.first_token = now
            self.hooks.spyglass_request_first_token(request=request)
        detokenizer = self.detokenizers[request.req_id]
        if deferred is not None and not detokenizer.stop:
            deferred.append((detokenizer, token_id))
        else:
            detokenizer.add_token(token_id)
        if token_id in request.eos_token_ids:
            self._finish(request, FinishReason.STOP)
        elif token_id in request.sampling_params.stop_token_ids:
            request.stop_reason = token_id
            self._finish(request, FinishReason.STOP)
        elif detokenizer.matched_stop is not None:
            request.stop_reason = detokenizer.matched_stop
            self._finish(request, FinishReason.STOP)
        elif (
            request.num_output_tokens >= request.max_tokens
            or request.num_tokens >= self.max_model_len
        ):
            self._finish(request, FinishReason.LENGTH)

    def _finish(self, request: Request, reason: FinishReason, error: str | None = None) -> None:
        if request.is_finished:
            return
        request.error = error
        request.times.finished = time.monotonic()
        self.scheduler.finish(request, reason)
        self.requests.pop(request.req_id, None)
        self.hooks.spyglass_request_finished(request=request, reason=reason)

    def _fail_request(self, request: Request, error: str) -> RequestOutput:
        """A plugin's decision about this request failed: end it with an error, keep serving the rest."""
        log.error("request %s failed: %s", request.req_id, error)
        self._finish(request, FinishReason.ERROR, error)
        return self._output(request)

    def _isolate_failure(self, out: SchedulerOutput, error: Exception) -> list[RequestOutput]:
        """A failed step is rerun one request at a time, so that only the requests that fail alone fail.

        Nothing was committed by the failed step (computed counts advance in `_update`), so the
        reruns recompute the same tokens; one poisoned request thus cannot take its batch with it.
        """
        log.warning(
            "model step %d failed with %d requests", out.step_id, len(out.scheduled), exc_info=error
        )
        # A step scheduled ahead may carry requests that the commit before it finished.
        alive = tuple(s for s in out.scheduled if not s.request.is_finished)
        out = dataclasses.replace(out, scheduled=alive)
        if len(alive) <= 1:
            return self._fail_step(out, error)
        outputs = []
        for scheduled in alive:
            solo = dataclasses.replace(out, scheduled=(scheduled,))
            try:
                runner_out = self.runner.collect(self._launch(solo))
            except Exception as solo_error:
                outputs += self._fail_step(solo, solo_error)
                continue
            outputs += self._update(solo, runner_out)
        return outputs

    def _fail_step(self, out: SchedulerOutput, error: Exception) -> list[RequestOutput]:
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
            self._finish(request, FinishReason.ERROR, f"{type(error).__name__}: {error}")
            outputs.append(self._output(request))
        return outputs

    def _output(self, request: Request) -> RequestOutput:
        detokenizer = self.detokenizers[request.req_id]
        finished = request.is_finished
        if finished:
            self.detokenizers.pop(request.req_id)
        completion = CompletionOutput(
            index=0,
            text=detokenizer.visible_text(finished),
            token_ids=list(request.output_token_ids),
            finish_reason=request.finish_reason.value if request.finish_reason else None,
            stop_reason=request.stop_reason,
            logprobs=None
            if request.logprobs is None
            else list(request.logprobs),  # a snapshot, like token_ids
        )
        return RequestOutput(
            request_id=request.req_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            num_cached_tokens=request.num_cached_tokens,
        )

    def _stats(
        self,
        out: SchedulerOutput,
        runner_out: RunnerOutput,
        num_generated: int,
        start: float,
        scheduled_time: float,
        update_time: float,
        end: float,
    ) -> StepStats:
        num_prefill = sum(1 for s in out.scheduled if s.num_new_tokens > 1 + s.num_spec_tokens)
        policy = self.scheduler.policy
        classes: dict[str, int] = {}
        for request in self.scheduler.waiting:
            try:
                label = policy.waiting_class(request)
            # only a metrics label: count it as a hook error, never fail a step for it
            except Exception:
                self.hooks.count_error(self.scheduler.policy_name, "waiting_class")
                label = "unknown"
            classes[label] = classes.get(label, 0) + 1
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
            schedule_time=scheduled_time - start,
            model_time=runner_out.model_time,
            update_time=update_time,
            start_time=start,
            end_time=end,
            waiting_by_class=tuple(sorted(classes.items())),
            tensor_parallel_size=self.config.tensor_parallel_size,
            mask_time=runner_out.mask_time,
        )

    def abort_all(self) -> list[RequestOutput]:
        """Abort every live request; their final outputs."""
        return [
            output for req_id in list(self.requests) if (output := self.abort(req_id)) is not None
        ]

    def shutdown(self) -> None:
        """Abort whatever is left and announce the stop."""
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
        return ModelDescription(self.model_name, self.max_model_len, self.arch.vocab_size)

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
        )
