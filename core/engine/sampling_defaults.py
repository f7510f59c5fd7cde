"""The sampling settings a request that leaves them out gets: the model's own, from its
``generation_config.json``, as vLLM takes them (``--generation-config auto``, its default), or
the API's (``--generation-config vllm``)."""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from spyglass.core.engine.sampling_params import SamplingParams

# generation_config.json's keys that set a default, and the SamplingParams field each sets.
_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
# transformers' GenerationConfig defaults: a file's value equal to one sets nothing (vLLM reads
# the file's difference from them).
_HF_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.0}
SOURCES = ("auto", "vllm")
"""``--generation-config``'s named values; any other is a directory holding the file."""


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Sampling settings for requests that do not give them (the API's own defaults unless the
    model's generation config says otherwise); ``max_tokens`` None: as many as the context
    holds (the completions API: 16). ``source`` names where they came from, for the logs."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = None
    source: str = ""

    def changed(self) -> dict:
        """The settings that differ from the API's own defaults."""
        plain = SamplingDefaults()
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "source" and getattr(self, field.name) != getattr(plain, field.name)
        }

    def params(self) -> SamplingParams:
        """`SamplingParams` with these settings (vLLM's ``LLM.get_default_sampling_params``)."""
        fields = self.changed()
        fields.setdefault("max_tokens", SamplingParams().max_tokens)
        return SamplingParams(**fields)


def read_sampling_defaults(
    source: str, model: str | None, overrides: dict | None = None
) -> SamplingDefaults:
    """The defaults ``source`` gives (``auto``: the model directory's generation_config.json,
    none for a GGUF file or a directory without one; ``vllm``: none; else the
    generation_config.json of the directory ``source`` names), ``overrides`` (keys of a
    generation config) applied last. ValueError for a file that cannot be read, keys
    ``overrides`` may not set, or values out of range."""
    config: dict = {}
    if source == "auto":
        if model is not None and Path(model).expanduser().is_dir():
            config = _read(Path(model).expanduser() / "generation_config.json", missing_ok=True)
    elif source != "vllm":
        config = _read(Path(source).expanduser() / "generation_config.json", missing_ok=False)
    unknown = sorted(set(overrides or {}) - set(_KEYS))
    if unknown:
        raise ValueError(
            f"override_generation_config {unknown}: the generation config keys that set request "
            f"defaults are {', '.join(_KEYS)}"
        )
    values = {
        _KEYS[key]: value
        for key, value in config.items()
        if key in _KEYS and value is not None and value != _HF_DEFAULTS.get(key)
    }
    values.update({_KEYS[key]: value for key, value in (overrides or {}).items()})
    origin = source if source != "auto" else "the model's generation_config.json"
    if overrides:
        origin += " and --override-generation-config"
    defaults = SamplingDefaults(**values, source=origin)
    try:
        defaults.params()
    except (TypeError, ValueError) as error:
        raise ValueError(f"the generation config's defaults do not hold: {error}") from None
    return defaults


def _read(path: Path, missing_ok: bool) -> dict:
    if not path.is_file():
        if missing_ok:
            return {}
        raise ValueError(f"--generation-config: {path} does not exist")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a readable generation config: {error}") from None
