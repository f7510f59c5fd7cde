"""Speculation with a separate small draft model sharing the target's tokenizer (method ``draft``).

Set the model with ``--plugin-option draft_model=PATH`` (GGUF file or HF directory) and its dtype
with ``draft_dtype`` (default: the target's). The entry point names `DraftModelProposer`: each
engine that speculates with ``draft`` gets its own proposer, which owns the draft engine (a
`DraftEngine`, id ``<target id>-draft``) and stops it when its target stops.
"""

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
    from spyglass.core.plugin_api import DraftEngine


class DraftModelProposer:
    """One target engine's draft-model proposer and the draft engine it owns."""

    method = "draft"

    def __init__(self, context: PluginContext):
        self.drafter: DraftEngine | None = None

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Load the draft model when this engine speculates with method ``draft``."""
        if config.speculative != self.method:
            return
        path = config.plugin_options.get("draft_model")
        if not path:
            raise ValueError("--speculative draft needs --plugin-option draft_model=PATH")
        dtype = dtype_named(config.plugin_options.get("draft_dtype", info.dtype))
        self.drafter = plugin_api.DraftEngine(plugin_api.load_checkpoint(path, dtype), config)

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
        """Greedy drafts from the draft model."""
        if method != self.method or self.drafter is None:
            return None
        return self.drafter.propose(requests, num_speculative_tokens)
