"""Attention and KV-cache kernels: Triton for CUDA beside pure-torch versions with the same signatures.

`select_backend` picks one implementation set per engine; the model calls `backend.store_kv` and
`backend.paged_attention` and never cares which it got.
"""
