"""The typed surface for plugin authors: import everything a plugin needs from here, and check it with mypy.

``hookimpl`` marks a hook implementation (pluggy checks parameter names when the plugin is
registered); `implements` does the same and also lets mypy check the whole signature against
the hookspec. The payload types are the engine's own: hooks receive live objects, to be read
and never mutated (a policy keeps its own state).

    from spyglass.core.plugin_api import FinishReason, Request, hookspecs, implements

    @implements(hookspecs.spyglass_request_finished)
    def spyglass_request_finished(request: Request, reason: FinishReason) -> None:
        ...
"""

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from spyglass.core.engine import hookspecs
from spyglass.core.engine.kv.block_pool import BlockPool
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.kv.kv_cache_manager import NO_MATCH, PrefixMatch
from spyglass.core.engine.request import FinishReason, Request, RequestStatus, RequestTimes
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.core.engine.sched.scheduler_policy import PreemptingPolicy, SchedulingPolicy, parse_tenant_values, tenant_of
from spyglass.core.engine.step_stats import EngineInfo, StepStats
from spyglass.core.engine.token_constraint import TokenConstraint
from spyglass.core.loaders.tokenizer import Tokenizer
from spyglass.core.engine.tool_calls import (
    CallObjectScanner,
    ParsedToolCall,
    ToolCallParser,
    ToolCallPiece,
    ToolCallStream,
    collect,
)

__all__ = [
    "NO_MATCH",
    "BlockPool",
    "EngineConfig",
    "EngineInfo",
    "FinishReason",
    "PrefixMatch",
    "PreemptingPolicy",
    "Request",
    "RequestStatus",
    "RequestTimes",
    "SamplingParams",
    "SchedulingPolicy",
    "StepStats",
    "StructuredOutput",
    "TokenConstraint",
    "Tokenizer",
    "CallObjectScanner",
    "ParsedToolCall",
    "ToolCallParser",
    "ToolCallPiece",
    "ToolCallStream",
    "collect",
    "hookimpl",
    "hookspecs",
    "implements",
    "parse_tenant_values",
    "tenant_of",
]

P = ParamSpec("P")
R = TypeVar("R")


def implements(spec: Callable[P, R], **options: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """``hookimpl(**options)`` for a function that must take exactly the parameters of hookspec ``spec``.

    mypy then reports a parameter of the wrong type or a wrong return type; at runtime the
    function's name must be the hookspec's. ``options`` are pluggy's (``tryfirst``, ``trylast``, ...).
    """
    if getattr(hookspecs, spec.__name__, None) is not spec:
        raise TypeError(f"{spec.__name__} is not a Spyglass hookspec")

    def mark(function: Callable[P, R]) -> Callable[P, R]:
        if function.__name__ != spec.__name__:
            raise TypeError(f"{function.__name__} implements {spec.__name__}: the names must match")
        return hookimpl(**options)(function)

    return mark
