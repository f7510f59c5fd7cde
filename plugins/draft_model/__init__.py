"""Speculation with a separate small draft model sharing the target's tokenizer (method ``draft``).

Set the model with ``--plugin-option draft_model=PATH`` (GGUF file or HF directory) and its dtype
with ``draft_dtype`` (default: the target's). The entry point names `DraftModelProposer`: each
engine that speculates with ``draft`` gets its own proposer, which owns the draft engine (a
`DraftEngine`, id ``<target id>-draft``) and stops it when its target stops.
"""

from typing import TYPE_CHECKING

from spyglass.core import plugin_api
from spyglass.core.plugin_api import DraftEngineProposer, EngineConfig, EngineInfo, dtype_named

if TYPE_CHECKING:  # loading a checkpoint imports torch: only when drafting starts
    from spyglass.core.plugin_api import Checkpoint


class DraftModelProposer(DraftEngineProposer):
    """One target engine's draft-model proposer and the draft engine it owns."""

    method = "draft"

    def draft_checkpoint(self, info: EngineInfo, config: EngineConfig) -> "Checkpoint":
        """The model ``--plugin-option draft_model=PATH`` names, in ``draft_dtype`` (default: the target's)."""
        path = config.plugin_options.get("draft_model")
        if not path:
            raise ValueError("--speculative draft needs --plugin-option draft_model=PATH")
        dtype = dtype_named(config.plugin_options.get("draft_dtype", info.dtype))
        return plugin_api.load_checkpoint(path, dtype)
