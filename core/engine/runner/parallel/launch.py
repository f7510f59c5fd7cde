"""Rank 0's side of tensor parallelism: start the worker processes and hold the group they form.

Rank 0 is the engine process. It shards the checkpoint it loaded, starts ranks 1..N-1 with
torch.multiprocessing (spawn; each worker's shard travels in shared memory, so the model is read
from disk once), waits until every worker has built itself, then joins the process groups. Its
`LeaderGroup` turns any collective failure into a `TensorParallelError` that names the rank that
died and how. It checks the workers' liveness before each step and, while it waits in a gloo
collective, every `WATCH_INTERVAL`: a dead worker, or one that has not answered within the step
timeout (hung, or stopped), fails the engine instead of leaving it waiting on a socket forever.
"""

import datetime
import logging
import signal
import time
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing

from spyglass.core.engine.config import DTYPE_NAMES, dtype_name
from spyglass.core.engine.runner.parallel.comm import (
    START_TIMEOUT,
    STEP_TIMEOUT,
    RankGroup,
    TensorParallelError,
)
from spyglass.core.engine.runner.parallel.step_codec import INIT, STOP, encode_step, header
from spyglass.core.engine.runner.parallel.worker import WorkerSpec, run_worker
from spyglass.core.models.parallel.layers import TensorParallelLlama
from spyglass.core.models.parallel.shard import check_tensor_parallel, plan_shard, shard_weights

log = logging.getLogger("spyglass.engine")

# How often rank 0 looks at its workers while it waits in a gloo collective.
WATCH_INTERVAL = datetime.timedelta(milliseconds=500)


def _describe_exit(process) -> str:
    code = process.exitcode
    if code is None:
        return "is alive"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _terminate(processes: list) -> None:
    """Stop whatever workers are still running (the engine went away without `LeaderGroup.stop`)."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


class LeaderGroup(RankGroup):
    """Rank 0's group: the collectives, plus the worker processes, their liveness and their stop."""

    def __init__(
        self,
        store: dist.Store,
        world_size: int,
        device: torch.device,
        processes: list,
        threads_before: int,
    ):
        self.processes = processes
        self.threads_before = (
            threads_before  # this process's torch threads before the ranks shared the cores
        )
        self.failure: TensorParallelError | None = None
        self._finalizer = weakref.finalize(self, _terminate, processes)
        self._wait_until_ready(store)
        # Rank 0 only sends on the control group, to workers waiting for it: a send that does not
        # finish within a step's time never will.
        super().__init__(store, 0, world_size, device, control_timeout=STEP_TIMEOUT)

    def _wait_until_ready(self, store: dist.Store) -> None:
        deadline = time.monotonic() + START_TIMEOUT.total_seconds()
        waiting = {rank: f"ready/{rank}" for rank in range(1, len(self.processes) + 1)}
        while waiting:
            for rank, key in list(waiting.items()):
                if store.check([key]):
                    del waiting[rank]
                elif not self.processes[rank - 1].is_alive():
                    self._finalizer()
                    raise TensorParallelError(
                        f"tensor-parallel rank {rank} {_describe_exit(self.processes[rank - 1])} while starting "
                        "(its traceback, if any, is on stderr)"
                    )
            if waiting and time.monotonic() > deadline:
                self._finalizer()
                raise TensorParallelError(
                    f"tensor-parallel ranks {sorted(waiting)} did not start within {START_TIMEOUT}"
                )
            time.sleep(0.02)

    def check_workers(self) -> None:
        """Raise `TensorParallelError` if the group broke earlier or a worker has died since."""
        if self.failure is not None:
            raise self.failure
        for rank, process in enumerate(self.processes, start=1):
            if not process.is_alive():
                raise self.fail(
                    f"tensor-parallel rank {rank} (pid {process.pid}) {_describe_exit(process)}"
                )

    def fail(self, reason: str | BaseException) -> TensorParallelError:
        """Mark the group broken (tearing it down) and return the error that says why; dead ranks are named."""
        if self.failure is not None:
            return self.failure
        if isinstance(reason, BaseException):
            self._wait_for_an_exit(
                seconds=2.0
            )  # a peer's sockets close a moment before it can be reaped
        dead = [
            f"rank {rank} (pid {p.pid}) {_describe_exit(p)}"
            for rank, p in enumerate(self.processes, start=1)
            if not p.is_alive()
        ]
        if isinstance(reason, BaseException):
            reason = f"a tensor-parallel collective failed ({type(reason).__name__}: {reason})"
        if dead and not reason.startswith("tensor-parallel rank"):
            reason = f"tensor-parallel {', '.join(dead)}; {reason}"
        self.failure = TensorParallelError(f"{reason}; the engine cannot continue")
        log.error("%s", self.failure)
        self.abort()
        self._finalizer()
        return self.failure

    def _wait_for_an_exit(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while all(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
            time.sleep(0.01)

    def _checked(self, operation, tensor: torch.Tensor):
        if self.failure is not None:
            raise self.failure
        try:
            return operation(tensor)
        except TensorParallelError:
            raise
        except Exception as error:
            raise self.fail(error) from error

    def _wait(self, work: dist.Work, group: dist.ProcessGroup) -> None:
        """Wait for a collective, checking the workers every `WATCH_INTERVAL` and giving up after the step timeout.

        NCCL's work is only queued on the stream (waiting on the host would stall the GPU), so it
        is waited on as is; gloo's blocks this thread until every peer has taken part.
        """
        if group is not self.control and self.device.type == "cuda":
            work.wait()
            return
        deadline = time.monotonic() + self.step_timeout.total_seconds()
        while True:
            try:
                work.wait(WATCH_INTERVAL)
                return
            except RuntimeError:
                if work.is_completed():
                    raise  # the collective failed (a peer closed its sockets): not a timeout
            self.check_workers()
            if time.monotonic() > deadline:
                raise self.fail(
                    f"a tensor-parallel collective did not finish within {self.step_timeout} "
                    "(a worker is alive but not answering: hung or stopped)"
                )

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._checked(super().all_reduce_, tensor)

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return self._checked(super().all_gather, tensor)

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._checked(super().broadcast_, tensor)

    def send_init(self, num_blocks: int, block_size: int, cache_dtype: torch.dtype) -> None:
        """Tell the workers the KV cache's size and dtype, so that each allocates its heads' share of it."""
        dtype_index = DTYPE_NAMES.index(dtype_name(cache_dtype))
        self.broadcast_(header(INIT, num_blocks, block_size, dtype_index))

    def send_step(self, input_ids, positions, meta, logits_indices) -> None:
        """Broadcast one forward's inputs; the workers run the same forward right after."""
        head, payload = encode_step(input_ids, positions, meta, logits_indices)
        self.broadcast_(head)
        self.broadcast_(payload)

    def stop(self) -> None:
        """Tell the workers to exit and wait for them (terminating stragglers); safe to call twice."""
        if self.failure is None and any(p.is_alive() for p in self.processes):
            try:
                self.broadcast_(header(STOP))
                for process in self.processes:
                    process.join(timeout=10)
            except TensorParallelError:
                pass
        self.failure = self.failure or TensorParallelError("the tensor-parallel group was stopped")
        self._finalizer()
        torch.set_num_threads(self.threads_before)


def launch_tensor_parallel(
    checkpoint, backend, device: torch.device, config
) -> TensorParallelLlama:
    """Start ranks 1..N-1 on their shards of ``checkpoint`` and return rank 0's model (its group attached).

    ``config.num_threads`` (or this process's thread count divided among the ranks) is every rank's
    torch thread count. Raises ``ValueError`` for a model or device count that cannot be split this way.
    """
    world_size, arch = config.tensor_parallel_size, checkpoint.arch
    check_tensor_parallel(arch, world_size)
    if device.type == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"tensor_parallel_size {world_size} needs {world_size} CUDA devices; "
            f"{torch.cuda.device_count()} visible"
        )
    threads_before = torch.get_num_threads()
    num_threads = config.num_threads or max(1, threads_before // world_size)
    torch.set_num_threads(num_threads)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=START_TIMEOUT
    )
    context = torch.multiprocessing.get_context("spawn")
    processes = []
    for rank in range(1, world_size):
        shard = plan_shard(arch, rank, world_size)
        spec = WorkerSpec(
            rank,
            world_size,
            store.port,
            arch,
            shard,
            device.type,
            config.attention_backend,
            num_threads,
        )
        process = context.Process(
            target=run_worker,
            args=(spec, shard_weights(checkpoint.weights, arch, shard)),
            name=f"spyglass-tp-rank{rank}",
            daemon=True,
        )
        process.start()
        processes.append(process)
    group = LeaderGroup(store, world_size, device, processes, threads_before)
    shard = plan_shard(arch, 0, world_size)
    log.info(
        "tensor parallelism: %d ranks (%s); rank 0 holds KV heads %s, query heads %s, vocabulary rows %s",
        world_size,
        "nccl" if device.type == "cuda" else "gloo",
        shard.kv_heads,
        shard.q_heads,
        shard.vocab,
    )
    return TensorParallelLlama.from_full_weights(
        arch, shard, checkpoint.weights, backend, device, group
    )
