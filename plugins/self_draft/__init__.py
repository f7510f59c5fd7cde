"""Self-speculation: the target model drafts with a cheaper copy of itself (method ``self``).

``--plugin-option self_draft_layers=N`` keeps only the first N layers (with the shared final norm
and head: layer skip); ``self_draft_dtype=bfloat16`` drafts in a faster dtype. Both may be combined.
The entry point names `SelfDraftProposer`: each engine gets its own, owning its own draft engine,
so a drafter never outlives its target or serves another engine.
"""

import dataclasses
from typing import TYPE_CHECKING

from spyglass.core import plugin_api
from spyglass.core.plugin_api import DraftEngineProposer, EngineConfig, EngineInfo, dtype_named

if TYPE_CHECKING:  # loading a checkpoint imports torch: only when drafting starts
    from spyglass.core.plugin_api import Checkpoint


def truncate_layers(checkpoint: "Checkpoint", num_layers: int) -> "Checkpoint":
    """The checkpoint with only its first ``num_layers`` decoder layers."""
    dropped = tuple(
        f"model.layers.{i}." for i in range(num_layers, checkpoint.arch.num_hidden_layers)
    )
    weights = {name: t for name, t in checkpoint.weights.items() if not name.startswith(dropped)}
    arch = dataclasses.replace(checkpoint.arch, num_hidden_layers=num_layers)
    return dataclasses.replace(checkpoint, arch=arch, weights=weights)


class SelfDraftProposer(DraftEngineProposer):
    """One target engine's self-speculation proposer and the draft engine it owns."""

    method = "self"

    def draft_checkpoint(self, info: EngineInfo, config: EngineConfig) -> "Checkpoint":
        """The target's own model: its first ``self_draft_layers`` layers, in ``self_draft_dtype``."""
        options = config.plugin_options
        checkpoint = plugin_api.load_checkpoint(
            config.model, dtype_named(options.get("self_draft_dtype", info.dtype))
        )
        if "self_draft_layers" in options:
            checkpoint = truncate_layers(checkpoint, int(options["self_draft_layers"]))
        return checkpoint
