"""Self-speculation: the target model drafts with a cheaper copy of itself (method ``self``).

``--plugin-option self_draft_layers=N`` keeps only the first N layers (with the shared final norm
and head: layer skip); ``self_draft_dtype=bfloat16`` drafts in a faster dtype. Both may be combined.
The entry point names `SelfDraftProposer`: each engine gets its own, owning its own draft engine,
so a drafter never outlives its target or serves another engine.
"""

import dataclasses
from typing import TYPE_CHECKING

from spyglass.core import plugin_api
from spyglass.core.plugin_api import (
    EngineConfig,
    EngineInfo,
    PluginContext,
    Request,
    dtype_named,
    hookimpl,
)

if (
    TYPE_CHECKING
):  # plugin_api loads the engine (and torch) when they are first used: when drafting starts
    from spyglass.core.plugin_api import Checkpoint, DraftEngine


def truncate_layers(checkpoint: "Checkpoint", num_layers: int) -> "Checkpoint":
    """The checkpoint with only its first ``num_layers`` decoder layers."""
    dropped = tuple(
        f"model.layers.{i}." for i in range(num_layers, checkpoint.arch.num_hidden_layers)
    )
    weights = {name: t for name, t in checkpoint.weights.items() if not name.startswith(dropped)}
    arch = dataclasses.replace(checkpoint.arch, num_hidden_layers=num_layers)
    return dataclasses.replace(checkpoint, arch=arch, weights=weights)


class SelfDraftProposer:
    """One target engine's self-speculation proposer and the draft engine it owns."""

    method = "self"

    def __init__(self, context: PluginContext):
        self.drafter: DraftEngine | None = None

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Build the cheaper copy when this engine speculates with method ``self``."""
        if config.speculative != self.method:
            return
        options = config.plugin_options
        checkpoint = plugin_api.load_checkpoint(
            config.model, dtype_named(options.get("self_draft_dtype", info.dtype))
        )
        if "self_draft_layers" in options:
            checkpoint = truncate_layers(checkpoint, int(options["self_draft_layers"]))
        self.drafter = plugin_api.DraftEngine(checkpoint, config)

    @hookimpl
    def spyglass_engine_stopped(self, info: EngineInfo) -> None:
        """The target stopped: stop the draft engine with it."""
        if self.drafter is not None:
            self.drafter.shutdown()
            self.drafter = None

    @hookimpl
    def spyglass_propose_drafts(
        self, method: str, requests: tuple[Request, ...], num_speculative_tokens: int
    ) -> dict[str, list[int]] | None:
        """Greedy drafts from the cheaper copy."""
        if method != self.method or self.drafter is None:
            return None
        return self.drafter.propose(requests, num_speculative_tokens)
