"""``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``: LoRA adapters added and removed
while serving, as vLLM's server does (only with ``--allow-runtime-lora``: the path is read on the
server's disk)."""

import msgspec
from litestar import post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from spyglass.core.api.context import ServingContext
from spyglass.core.api.errors import APIError
from spyglass.core.api.validation import json_body_guard


class LoadLoRARequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The adapter's name (the ``model`` requests then send) and its PEFT directory."""

    lora_name: str
    lora_path: str


class UnloadLoRARequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The adapter to unload."""

    lora_name: str


class LoRAAdapterCard(msgspec.Struct):
    """A loaded adapter."""

    lora_name: str
    lora_path: str
    rank: int
    object: str = "lora_adapter"


def _check_runtime_loading(serving: ServingContext) -> None:
    if not serving.lora_enabled:
        raise APIError(400, "LoRA adapters are off on this server (--enable-lora)", "lora_name")
    if not serving.options.allow_runtime_lora:
        raise APIError(
            403,
            "loading LoRA adapters at run time is off (--allow-runtime-lora)",
            code="runtime_lora_disabled",
        )


@post(
    "/v1/load_lora_adapter",
    summary="Load a LoRA adapter",
    tags=["lora"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": LoadLoRARequest},
)
async def load_lora_adapter(
    data: JSONBody[LoadLoRARequest], serving: NamedDependency[ServingContext]
) -> LoRAAdapterCard:
    """Load a PEFT adapter; requests then name it as their ``model``."""
    _check_runtime_loading(serving)
    name = data.lora_name
    if name in serving.model_aliases:
        raise APIError(400, f"`{name}` is the served model's name", "lora_name")
    if name in serving.loras:
        raise APIError(400, f"a LoRA adapter named `{name}` is already loaded", "lora_name")
    serving.admit()
    try:
        info = await serving.async_engine.load_lora(name, data.lora_path)
    except ValueError as error:
        raise APIError(400, str(error), "lora_path") from None
    serving.loras[name] = info
    return LoRAAdapterCard(info.name, info.path, info.rank)


@post(
    "/v1/unload_lora_adapter",
    summary="Unload a LoRA adapter",
    tags=["lora"],
    status_code=200,
    guards=[json_body_guard],
    opt={"body": UnloadLoRARequest},
)
async def unload_lora_adapter(
    data: JSONBody[UnloadLoRARequest], serving: NamedDependency[ServingContext]
) -> LoRAAdapterCard:
    """Unload an adapter: new requests naming it get a 404, running ones finish with it."""
    _check_runtime_loading(serving)
    info = serving.loras.get(data.lora_name)
    if info is None:
        raise APIError(
            404, f"no LoRA adapter named `{data.lora_name}` is loaded", "lora_name", "not_found"
        )
    serving.admit()
    await serving.async_engine.unload_lora(data.lora_name)
    del serving.loras[data.lora_name]
    return LoRAAdapterCard(info.name, info.path, info.rank)
