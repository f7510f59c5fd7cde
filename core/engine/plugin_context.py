"""What a plugin factory is given: the engine it will serve, by configuration, id and telemetry settings."""

import dataclasses
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spyglass.core.engine.config import EngineConfig

if TYPE_CHECKING:  # the engine carries its plugins' settings without using them
    from spyglass.telemetry.settings import TelemetrySettings

# Engine ids are unique within the process; a counter, not per-engine state.
_engine_numbers = itertools.count()


def new_engine_id() -> str:
    """The next process-unique engine id: "0", "1", ..."""
    return str(next(_engine_numbers))


@dataclass(frozen=True, slots=True)
class PluginContext:
    """One engine, as its plugins see it when they are created.

    ``config`` is the engine's configuration with ``engine_id`` filled in; ``engine_id`` labels
    everything the engine's plugins emit (the ``engine`` metric label); ``telemetry`` says which
    metrics, traces and logs to emit. The engine passes it through without reading it; None (an
    engine given no settings) means the process default, which telemetry plugins resolve with
    `spyglass.telemetry.settings.resolve`.
    """

    config: EngineConfig
    engine_id: str
    telemetry: "TelemetrySettings | None"

    @classmethod
    def for_config(cls, config: EngineConfig) -> "PluginContext":
        """The context of an engine about to start with ``config``: a fresh id if it has none."""
        engine_id = config.engine_id or new_engine_id()
        return cls(dataclasses.replace(config, engine_id=engine_id), engine_id, config.telemetry)
