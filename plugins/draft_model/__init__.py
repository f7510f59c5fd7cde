"""Speculation with a separate small draft model sharing the target's tokenizer (method ``draft``).

Set the model with ``--plugin-option draft_model=PATH`` (GGUF file or HF directory) and its dtype
with ``draft_dtype`` (default: the target's).
"""

from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.engine.config import dtype_named
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.plugins.draft_model.drafter import EngineDrafter

_state: dict[str, EngineDrafter] = {}


@hookimpl
def spyglass_engine_started(info, config):
    """Load the draft model when this engine speculates with method ``draft``."""
    if config.speculative != "draft":
        return
    path = config.plugin_options.get("draft_model")
    if not path:
        raise ValueError("--speculative draft needs --plugin-option draft_model=PATH")
    dtype = dtype_named(config.plugin_options.get("draft_dtype", info.dtype))
    checkpoint = load_checkpoint(path, dtype)
    _state["drafter"] = EngineDrafter(checkpoint, config)


@hookimpl
def spyglass_propose_drafts(method, requests, num_speculative_tokens):
    """Greedy drafts from the draft model."""
    if method != "draft" or "drafter" not in _state:
        return None
    return _state["drafter"].propose(requests, num_speculative_tokens)
