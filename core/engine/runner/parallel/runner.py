"""Rank 0's model runner under tensor parallelism: the same steps, with each forward's inputs broadcast first."""

import logging

import torch

from spyglass.core.engine.runner.model_runner import ModelRunner
from spyglass.core.engine.runner.parallel.comm import TensorParallelError
from spyglass.core.engine.runner.parallel.launch import LeaderGroup
from spyglass.core.engine.runner.step_inputs import StepInputs
from spyglass.core.models.image_rows import ImageRows
from spyglass.core.models.parallel.layers import TensorParallelLlama

log = logging.getLogger("spyglass.engine")


class ParallelModelRunner(ModelRunner):
    """`ModelRunner` over rank 0's `TensorParallelLlama`: preparation and sampling stay here, on rank 0.

    Before each forward it checks that every worker is alive and broadcasts the forward's inputs;
    the workers then run the same forward on their shards. Any failure inside the forward is a
    `TensorParallelError` (a `FatalRunnerError`): the ranks may be out of step, so no step can follow.
    """

    def __init__(
        self,
        model: TensorParallelLlama,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        cache_dtype: torch.dtype,
    ):
        super().__init__(model, num_blocks, block_size, device, cache_dtype)
        self.group: LeaderGroup = model.comm
        self.group.send_init(num_blocks, block_size, cache_dtype)

    def enable_cuda_graphs(self, max_num_seqs: int, max_model_len: int) -> float:
        """Not with tensor parallelism (the inputs' broadcast runs on the host each step): decode runs eagerly."""
        log.info("CUDA graphs are not captured with tensor parallelism; decode runs eagerly")
        return 0.0

    def _forward(self, inputs: StepInputs, num_reqs: int, images: ImageRows | None) -> torch.Tensor:
        # ``images`` is always None: a vision model runs without tensor parallelism.
        self.group.check_workers()
        try:
            self.group.send_step(
                inputs.input_ids, inputs.positions, inputs.meta, inputs.logits_indices
            )
            return super()._forward(inputs, num_reqs, images)
        except TensorParallelError:
            raise
        except Exception as error:
            # Rank 0 failed between two collectives, which the workers are already waiting in.
            raise self.group.fail(error) from error

    def close(self) -> None:
        """Stop the workers."""
        self.group.stop()
