"""One rank's process groups: a control group for each step's inputs and a data group for the model's collectives.

Both are torch.distributed backends built over a private TCP store (not the global default group,
so several engines, or tests, can come and go in one process). The control group is always gloo
on the CPU; a worker's waits indefinitely there (an idle worker waits for the next step), rank 0's
sends give up after the step timeout (a send to a worker that stopped taking them would otherwise
pend in gloo's thread for a year, and the group's destructor, which joins that thread, with it:
a test session hung so, in a garbage collection long after the failure); the data group
is gloo on the CPU or NCCL on CUDA and times out after ``step_timeout``. A peer that dies closes
its sockets, so gloo raises at once instead of waiting for the timeout. Every collective goes
through `RankGroup._wait`, which rank 0 overrides to watch its workers while it waits.
"""

import contextlib
import datetime

import torch
import torch.distributed as dist

from spyglass.core.engine.runner.model_runner import FatalRunnerError

# Workers wait for the next step on the control group for as long as the engine is idle.
IDLE_TIMEOUT = datetime.timedelta(days=365)
STEP_TIMEOUT = datetime.timedelta(seconds=120)
START_TIMEOUT = datetime.timedelta(seconds=600)


class TensorParallelError(FatalRunnerError):
    """A tensor-parallel rank died, hung or failed mid-step: the group is broken and the engine must stop."""


def _gloo(
    store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta
) -> dist.ProcessGroupGloo:
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


class RankGroup:
    """This rank's control and data groups, and the collectives of `models.parallel.layers.Collectives`."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        device: torch.device,
        step_timeout: datetime.timedelta = STEP_TIMEOUT,
        control_timeout: datetime.timedelta = IDLE_TIMEOUT,
    ):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.step_timeout = step_timeout
        self.control = _gloo(dist.PrefixStore("control", store), rank, world_size, control_timeout)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = step_timeout
            self.data = dist.ProcessGroupNCCL(
                dist.PrefixStore("data", store), rank, world_size, options
            )
        else:
            self.data = _gloo(dist.PrefixStore("data", store), rank, world_size, step_timeout)

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks in place; returns it."""
        self._wait(self.data.allreduce([tensor]), self.data)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``tensor`` (all the same shape), in rank order."""
        gathered = [torch.empty_like(tensor) for _ in range(self.world_size)]
        self._wait(self.data.allgather([gathered], [tensor]), self.data)
        return gathered

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's CPU ``tensor`` into every rank's ``tensor`` (same shape and dtype), over the control group."""
        # BroadcastOptions default: root rank 0.
        self._wait(self.control.broadcast([tensor]), self.control)
        return tensor

    def _wait(self, work: dist.Work, group: dist.ProcessGroup) -> None:
        """Wait for one collective on ``group`` (a worker waits as long as the group's timeout allows)."""
        work.wait()

    def abort(self) -> None:
        """Tear the groups down after a failure, so that nothing waits on a peer that is gone."""
        for group in (self.data, self.control):
            # Best effort: some backends cannot abort, and the peer is gone anyway.
            with contextlib.suppress(Exception):
                group.abort()
