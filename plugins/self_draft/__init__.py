"""Self-speculation: the target model drafts with a cheaper copy of itself (method ``self``).

``--plugin-option self_draft_layers=N`` keeps only the first N layers (with the shared final norm
and head: layer skip); ``self_draft_dtype=bfloat16`` drafts in a faster dtype. Both may be combined.
"""

import dataclasses

from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.engine.config import dtype_named
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.plugins.draft_model.drafter import EngineDrafter

_state: dict[str, EngineDrafter] = {}


def truncate_layers(checkpoint: Checkpoint, num_layers: int) -> Checkpoint:
    """The checkpoint with only its first ``num_layers`` decoder layers."""
    dropped = tuple(f"model.layers.{i}." for i in range(num_layers, checkpoint.arch.num_hidden_layers))
    weights = {name: t for name, t in checkpoint.weights.items() if not name.startswith(dropped)}
    arch = dataclasses.replace(checkpoint.arch, num_hidden_layers=num_layers)
    return dataclasses.replace(checkpoint, arch=arch, weights=weights)


@hookimpl
def spyglass_engine_started(info, config):
    """Build the cheaper copy when this engine speculates with method ``self``."""
    if config.speculative != "self":
        return
    options = config.plugin_options
    checkpoint = load_checkpoint(config.model, dtype_named(options.get("self_draft_dtype", info.dtype)))
    if "self_draft_layers" in options:
        checkpoint = truncate_layers(checkpoint, int(options["self_draft_layers"]))
    _state["drafter"] = EngineDrafter(checkpoint, config)


@hookimpl
def spyglass_propose_drafts(method, requests, num_speculative_tokens):
    """Greedy drafts from the cheaper copy."""
    if method != "self" or "drafter" not in _state:
        return None
    return _state["drafter"].propose(requests, num_speculative_tokens)
