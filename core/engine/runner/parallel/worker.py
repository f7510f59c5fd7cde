"""A tensor-parallel worker process (ranks 1..N-1): build its model shard, then run every forward rank 0 runs.

The worker holds no scheduler, sampler or plugins: it waits on the control group for the next
message from rank 0 (the KV cache's size, a step's inputs, or stop), runs the same forward on its
shard and joins the collectives. Its KV cache holds only its own KV heads.
"""

import logging
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from spyglass.core.engine.config import DTYPE_NAMES, dtype_named
from spyglass.core.engine.kv.host_memory import keep_freed_memory_mapped
from spyglass.core.engine.runner.model_runner import ModelRunner
from spyglass.core.engine.runner.parallel.comm import START_TIMEOUT, RankGroup
from spyglass.core.engine.runner.parallel.step_codec import HEADER_LEN, INIT, STOP, decode_step
from spyglass.core.models.model_config import ModelArchConfig
from spyglass.core.models.parallel.layers import TensorParallelLlama
from spyglass.core.models.parallel.shard import RankShard
from spyglass.kernels.backend import select_backend

log = logging.getLogger("spyglass.engine")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs besides its weights: where the group meets and how to build its model."""

    rank: int
    world_size: int
    store_port: int
    arch: ModelArchConfig
    shard: RankShard
    device_type: str
    attention_backend: str
    num_threads: int


def run_worker(spec: WorkerSpec, weights: dict) -> None:
    """A worker process's whole life (the spawn target): join, build, serve until stopped."""
    torch.set_num_threads(spec.num_threads)
    torch.set_flush_denormal(True)
    keep_freed_memory_mapped()
    device = torch.device("cuda", spec.rank) if spec.device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = select_backend(
        device, spec.attention_backend
    )  # compiles or loads the kernels before "ready"
    store = dist.TCPStore("127.0.0.1", spec.store_port, is_master=False, timeout=START_TIMEOUT)
    store.set(f"ready/{spec.rank}", "1")
    group = RankGroup(store, spec.rank, spec.world_size, device)
    model = TensorParallelLlama(spec.arch, spec.shard, weights, backend, device, group)
    del weights
    try:
        serve(group, model)
    except RuntimeError as error:  # rank 0 went away (or a peer died): nothing left to serve
        print(
            f"spyglass tensor-parallel rank {spec.rank}: stopping, the group broke: {error}",
            file=sys.stderr,
        )
        group.abort()
        sys.exit(1)


@torch.inference_mode()
def serve(group: RankGroup, model: TensorParallelLlama) -> None:
    """Run rank 0's messages until it says stop: allocate the KV cache, then one forward per step."""
    runner: ModelRunner | None = None
    head = torch.empty(HEADER_LEN, dtype=torch.int64)
    while True:
        group.broadcast_(head)
        command = int(head[0])
        if command == STOP:
            return
        if command == INIT:
            cache_dtype = dtype_named(DTYPE_NAMES[int(head[3])])
            runner = ModelRunner(model, int(head[1]), int(head[2]), group.device, cache_dtype)
            continue
        payload = group.broadcast_(torch.empty(int(head[1]), dtype=torch.int64))
        step = decode_step(head, payload, group.device)
        model.forward(
            step.input_ids, step.positions, step.meta, runner.kv_caches, step.logits_indices
        )
