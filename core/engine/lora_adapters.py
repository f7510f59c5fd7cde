"""One engine's LoRA adapters: loaded by name, looked up for each request that names one."""

import dataclasses
import itertools

import torch

from spyglass.core.engine.lora_info import LoRAInfo
from spyglass.core.engine.sampling_params import InvalidRequestError
from spyglass.core.loaders.lora_loader import load_lora_adapter
from spyglass.core.models.lora import LoRAAdapter
from spyglass.core.models.model_config import ModelArchConfig


class LoRAAdapters:
    """The adapters one engine has loaded, by name."""

    def __init__(
        self, arch: ModelArchConfig, max_rank: int, dtype: torch.dtype, device: torch.device
    ):
        self.arch = arch
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.loaded: dict[str, LoRAAdapter] = {}
        self._load_ids = itertools.count(1)

    def load(self, name: str, path: str) -> LoRAInfo:
        """Load the adapter at ``path`` as ``name`` (again the same: nothing to do); ValueError when
        it cannot run on this model or the name is taken by another path."""
        if not name or not name.strip():
            raise ValueError("a LoRA adapter needs a name")
        known = self.loaded.get(name)
        if known is not None:
            if known.path != str(path):
                raise ValueError(f"the LoRA adapter {name!r} is already loaded from {known.path}")
            return _info(known)
        adapter = load_lora_adapter(path, name, self.arch, self.max_rank, self.dtype, self.device)
        adapter = dataclasses.replace(adapter, load_id=next(self._load_ids))
        self.loaded[name] = adapter
        return _info(adapter)

    def unload(self, name: str) -> None:
        """Forget ``name`` for new requests (requests already running with it finish with it)."""
        if self.loaded.pop(name, None) is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded")

    def get(self, name: str) -> LoRAAdapter:
        """The adapter a request names; `InvalidRequestError` for one not loaded."""
        adapter = self.loaded.get(name)
        if adapter is None:
            raise InvalidRequestError(f"no LoRA adapter named {name!r} is loaded", "model")
        return adapter

    def infos(self) -> tuple[LoRAInfo, ...]:
        """Every loaded adapter, in load order."""
        return tuple(_info(a) for a in self.loaded.values())


def _info(adapter: LoRAAdapter) -> LoRAInfo:
    return LoRAInfo(adapter.name, adapter.path, adapter.rank, adapter.num_parameters)
