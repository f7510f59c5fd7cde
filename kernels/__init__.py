"""Model kernels: Triton for CUDA, compiled C++ for the CPU, and pure-torch references with the same signatures.

`select_backend` picks one kernel set per engine; the model calls `backend.store_kv`,
`backend.paged_attention` and the layer ops (`add_rms_norm`, `rotary_embedding_`, `silu_and_mul`)
and never cares which it got.
"""
