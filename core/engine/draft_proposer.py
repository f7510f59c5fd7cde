"""What every draft-engine proposer shares: it owns a draft engine, started and stopped with its target.

A plugin subclasses `DraftEngineProposer`, names its ``method`` and says which checkpoint drafts
(`draft_checkpoint`); the base class builds the `DraftEngine` when its target starts speculating
with that method, answers ``spyglass_propose_drafts`` from it, and stops it when the target stops.
The engine (and torch) are imported only when a draft engine is built.
"""

from typing import TYPE_CHECKING

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.plugin_context import PluginContext
from spyglass.core.engine.request import Request
from spyglass.core.engine.step_stats import EngineInfo

if TYPE_CHECKING:
    from spyglass.core.engine.draft_engine import DraftEngine
    from spyglass.core.loaders.checkpoint import Checkpoint


class DraftEngineProposer:
    """One target engine's proposer and the draft engine it owns (None until the target speculates)."""

    method = ""

    def __init__(self, context: PluginContext):
        self.drafter: DraftEngine | None = None

    def draft_checkpoint(self, info: EngineInfo, config: EngineConfig) -> "Checkpoint":
        """The model that drafts for the target ``config`` describes."""
        raise NotImplementedError

    @hookimpl
    def spyglass_engine_started(self, info: EngineInfo, config: EngineConfig) -> None:
        """Build the draft engine when this engine speculates with ``method``."""
        if config.speculative == self.method:
            from spyglass.core.engine.draft_engine import DraftEngine

            self.drafter = DraftEngine(self.draft_checkpoint(info, config), config)

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
        """Greedy drafts from the draft engine, for this proposer's method."""
        if method != self.method or self.drafter is None:
            return None
        return self.drafter.propose(requests, num_speculative_tokens)
