"""Tensor parallelism on the model side: how weights shard over ranks, and one rank's model."""
