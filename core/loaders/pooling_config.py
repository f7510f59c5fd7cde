"""How a checkpoint says its embeddings pool the prompt: sentence-transformers' ``modules.json``
and the config of its Pooling module (``1_Pooling/config.json``), as vLLM reads them."""

import json
from pathlib import Path

# sentence-transformers' mode flags, in the order it reads them, and the names the engine runs.
_MODES = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
_POOLING_MODULE = "sentence_transformers.models.Pooling"


def sentence_transformers_pooling(path: Path) -> str | None:
    """The pooling the model directory's sentence-transformers config names (``last``, ``mean``,
    ``cls``, or the name of a mode the engine does not run, such as ``max`` or
    ``mean_without_prompt``); None without such a config."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    module = next((m for m in modules if m.get("type") == _POOLING_MODULE), None)
    if module is None:
        return None
    config_file = path / module.get("path", "") / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    chosen = [name for flag, name in _MODES.items() if config.get(flag)]
    if len(chosen) != 1:
        return "+".join(chosen) or "none"
    if config.get("include_prompt") is False:  # an instruction left out of the mean
        return f"{chosen[0]}_without_prompt"
    return chosen[0]
