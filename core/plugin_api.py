"""The typed surface for plugin authors: import everything a plugin needs from here, and check it with mypy.

Plugins import nothing else from ``spyglass.core`` (``spyglass.telemetry`` and ``spyglass.kernels``
are theirs to use), and never import each other.

``hookimpl`` marks a hook implementation (pluggy checks parameter names when the plugin is
registered); `implements` does the same and also lets mypy check the whole signature against
the hookspec. The payload types are the engine's own: hooks receive live objects, to be read
and never mutated (a policy keeps its own state).

    from spyglass.core.plugin_api import FinishReason, Request, hookspecs, implements

    @implements(hookspecs.spyglass_request_finished)
    def spyglass_request_finished(request: Request, reason: FinishReason) -> None:
        ...

A plugin with per-engine state is a class named by its entry point: each engine calls it with a
`PluginContext` and registers the instance; `implements` marks its methods the same way.
"""

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar, overload

from spyglass.core.engine import hookspecs
from spyglass.core.engine.answer_reading import (
    AnswerReading,
    ParserLookup,
    ReadAnswer,
    answer_text,
    read_request_answer,
)
from spyglass.core.engine.config import DTYPE_NAMES, EngineConfig, dtype_named
from spyglass.core.engine.draft_proposer import DraftEngineProposer
from spyglass.core.engine.hookspecs import hookimpl
from spyglass.core.engine.kv.block_pool import BlockPool
from spyglass.core.engine.kv.kv_cache_manager import NO_MATCH, PrefixMatch
from spyglass.core.engine.plugin_context import PluginContext
from spyglass.core.engine.pooling_params import PoolingParams
from spyglass.core.engine.reasoning import ReasoningParser, ReasoningPiece, ReasoningStream
from spyglass.core.engine.request import FinishReason, Request, RequestStatus, RequestTimes
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.core.engine.sched.scheduler_policy import (
    PreemptingPolicy,
    SchedulingPolicy,
    parse_tenant_values,
    tenant_of,
)
from spyglass.core.engine.step_stats import STEP_FORWARDS, EngineInfo, StepStats
from spyglass.core.engine.text_tags import TagSplit, partial_suffix, split_at_tag
from spyglass.core.engine.token_constraint import TokenConstraint
from spyglass.core.engine.tool_calls import (
    CallObjectScanner,
    ParsedToolCall,
    StreamingToolCallParser,
    StrippedContent,
    ToolCallParser,
    ToolCallPiece,
    ToolCallStream,
    calls_schema,
    collect,
    parse_whole,
)
from spyglass.core.tokenizer import Tokenizer

# What builds or loads a model imports torch: loaded on first use, so that plugins (and
# `spyglass plugins`) load without it. mypy sees them as ordinary imports.
if TYPE_CHECKING:
    from spyglass.core.engine.draft_engine import DraftEngine
    from spyglass.core.loaders.checkpoint import Checkpoint
    from spyglass.core.loaders.load import load_checkpoint

_ON_FIRST_USE = {
    "DraftEngine": "spyglass.core.engine.draft_engine",
    "Checkpoint": "spyglass.core.loaders.checkpoint",
    "load_checkpoint": "spyglass.core.loaders.load",
}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DTYPE_NAMES",
    "NO_MATCH",
    "STEP_FORWARDS",
    "AnswerReading",
    "BlockPool",
    "CallObjectScanner",
    "Checkpoint",
    "DraftEngine",
    "DraftEngineProposer",
    "EngineConfig",
    "EngineInfo",
    "FinishReason",
    "ParsedToolCall",
    "ParserLookup",
    "PluginContext",
    "PoolingParams",
    "PreemptingPolicy",
    "PrefixMatch",
    "ReadAnswer",
    "ReasoningParser",
    "ReasoningPiece",
    "ReasoningStream",
    "Request",
    "RequestStatus",
    "RequestTimes",
    "SamplingParams",
    "SchedulingPolicy",
    "StepStats",
    "StreamingToolCallParser",
    "StrippedContent",
    "StructuredOutput",
    "TagSplit",
    "TokenConstraint",
    "Tokenizer",
    "ToolCallParser",
    "ToolCallPiece",
    "ToolCallStream",
    "answer_text",
    "calls_schema",
    "collect",
    "dtype_named",
    "hookimpl",
    "hookspecs",
    "implements",
    "load_checkpoint",
    "parse_tenant_values",
    "parse_whole",
    "partial_suffix",
    "read_request_answer",
    "split_at_tag",
    "tenant_of",
]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


class HookMarker(Protocol[P, R]):
    """What `implements` returns: marks a function, or a method (``self`` first), with the hookspec's signature."""

    @overload
    def __call__(self, function: Callable[P, R]) -> Callable[P, R]: ...

    @overload
    def __call__(
        self, function: Callable[Concatenate[S, P], R]
    ) -> Callable[Concatenate[S, P], R]: ...


def implements(spec: Callable[P, R], **options: Any) -> HookMarker[P, R]:
    """``hookimpl(**options)`` for a function (or method) that must take exactly the parameters of hookspec ``spec``.

    mypy then reports a parameter of the wrong type or a wrong return type; at runtime the
    function's name must be the hookspec's. ``options`` are pluggy's (``tryfirst``, ``trylast``, ...).
    """
    if getattr(hookspecs, spec.__name__, None) is not spec:
        raise TypeError(f"{spec.__name__} is not a Spyglass hookspec")

    def mark(function: Any) -> Any:
        if function.__name__ != spec.__name__:
            raise TypeError(f"{function.__name__} implements {spec.__name__}: the names must match")
        marked: Callable[P, R] = hookimpl(**options)(function)
        return marked

    return mark  # type: ignore[return-value]
