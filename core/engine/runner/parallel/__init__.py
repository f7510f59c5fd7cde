"""Tensor parallelism on the engine side: rank 0 starts the workers, broadcasts each step, gathers the logits."""

from spyglass.core.engine.runner.parallel.comm import TensorParallelError
from spyglass.core.engine.runner.parallel.launch import launch_tensor_parallel
from spyglass.core.engine.runner.parallel.runner import ParallelModelRunner

__all__ = ["ParallelModelRunner", "TensorParallelError", "launch_tensor_parallel"]
