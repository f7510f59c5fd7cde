"""What a plugin factory is given: the engine it will serve, by configuration, id and telemetry settings."""

import dataclasses
import itertools
from dataclasses import dataclass

from spyglass.core.engine.config import EngineConfig
from spyglass.telemetry import settings as telemetry_settings
from spyglass.telemetry.settings import TelemetrySettings

# Engine ids are unique within the process; a counter, not per-engine state.
_engine_numbers = itertools.count()


def new_engine_id() -> str:
    """The next process-unique engine id: "0", "1", ..."""
    return str(next(_engine_numbers))


@dataclass(frozen=True, slots=True)
class PluginContext:
    """One engine, as its plugins see it when they are created.

    ``config`` is the engine's configuration with ``engine_id`` and ``telemetry`` filled in;
    ``engine_id`` labels everything the engine's plugins emit (the ``engine`` metric label);
    ``telemetry`` says which metrics, traces and logs to emit. Plugins read their settings from
    here, never from process-wide state.
    """

    config: EngineConfig
    engine_id: str
    telemetry: TelemetrySettings

    @classmethod
    def for_config(cls, config: EngineConfig) -> "PluginContext":
        """The context of an engine about to start with ``config``: a fresh id and the default settings if unset."""
        engine_id = config.engine_id or new_engine_id()
        telemetry = config.telemetry or telemetry_settings.current()
        resolved = dataclasses.replace(config, engine_id=engine_id, telemetry=telemetry)
        return cls(resolved, engine_id, telemetry)
