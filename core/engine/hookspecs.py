"""Every hook Spyglass offers plugins, grouped by phase.

Events return nothing (results are ignored; an exception is logged and counted, never fatal).
Decisions are ``firstresult``: the first implementation returning something other than None
wins; plugins registered later are asked first, so a third-party plugin overrides a built-in.
A decision that raises (here or in a policy's methods) fails only the request it was about,
with finish reason ``error`` and ``request.error`` naming the failure; the engine carries on.
Request objects passed to hooks are the engine's live state: read them, never mutate them.
Hooks run in the engine thread, per step or per request event, never inside the model.
"""

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from spyglass.core.engine.config import EngineConfig
    from spyglass.core.engine.kv.block_pool import BlockPool
    from spyglass.core.engine.kv.kv_cache_manager import PrefixMatch
    from spyglass.core.engine.reasoning import ReasoningParser
    from spyglass.core.engine.request import FinishReason, Request
    from spyglass.core.engine.sampling_params import StructuredOutput
    from spyglass.core.engine.sched.scheduler_policy import SchedulingPolicy
    from spyglass.core.engine.step_stats import EngineInfo, StepStats
    from spyglass.core.engine.token_constraint import TokenConstraint
    from spyglass.core.engine.tool_calls import ToolCallParser
    from spyglass.core.tokenizer import Tokenizer

PROJECT = "spyglass"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- engine lifecycle -------------------------------------------------------------------------


@hookspec
def spyglass_engine_started(info: "EngineInfo", config: "EngineConfig") -> None:
    """The engine has loaded its model and allocated its KV cache; ``info`` describes both.

    ``config`` is the engine's configuration, including ``plugin_options`` for plugins' own settings.
    """


@hookspec
def spyglass_engine_stopped(info: "EngineInfo") -> None:
    """The engine loop has stopped; no more hooks fire after this one."""


# -- request lifecycle ------------------------------------------------------------------------


@hookspec
def spyglass_request_added(request: "Request") -> None:
    """A request was accepted into the waiting queue (its ``times.arrival`` is set)."""


@hookspec
def spyglass_request_scheduled(request: "Request", resumed: bool) -> None:
    """A waiting request got KV blocks and joined the running batch.

    ``resumed`` is True when it returns after a preemption. ``request.num_cached_tokens``
    holds the prefix-cache hit found at admission.
    """


@hookspec
def spyglass_request_first_token(request: "Request") -> None:
    """The request's first output token was sampled (``times.first_token`` is set)."""


@hookspec
def spyglass_request_preempted(request: "Request") -> None:
    """The request lost its KV blocks to make room and went back to the waiting queue; it will be recomputed."""


@hookspec
def spyglass_request_finished(request: "Request", reason: "FinishReason") -> None:
    """The request ended: ``reason`` is stop, length, abort or error (``request.error`` says why for error).

    Its blocks are already back in the pool.
    """


# -- steps ------------------------------------------------------------------------------------


@hookspec
def spyglass_step_started(step_id: int, scheduled: "tuple[Request, ...]") -> None:
    """The engine scheduled step ``step_id`` and runs the model for ``scheduled``.

    Called before the forward, or with async output (`EngineConfig.async_output`) just after the
    step was launched and the previous step was announced finished: a step's start and finish are
    never interleaved with another step's. With async scheduling a step is planned before the
    previous one's tokens are known; ``scheduled`` leaves out the requests those tokens finished
    (the step still computes a row for each, and drops it).
    """


@hookspec
def spyglass_step_finished(stats: "StepStats") -> None:
    """Step ``stats.step_id`` finished: batch composition, tokens, timings and KV usage.

    With async output it comes while the next step runs: its queue and KV figures are read then.
    """


# -- decisions --------------------------------------------------------------------------------


@hookspec(firstresult=True)
def spyglass_scheduling_policy(name: str, config: "EngineConfig") -> "SchedulingPolicy | None":
    """Return a `SchedulingPolicy` if this plugin implements the policy called ``name``, else None.

    Called once at engine start; ``config.scheduling_policy`` is the requested name. A policy
    that also has ``should_preempt_for`` (`PreemptingPolicy`) may preempt running requests for
    a waiting one that does not get KV blocks.
    """


@hookspec(firstresult=True)
def spyglass_match_prefix(
    request: "Request", block_pool: "BlockPool", block_size: int
) -> "PrefixMatch | None":
    """Return cached full blocks holding the request's leading tokens, or None for no reuse.

    Called when a request with nothing computed is about to be admitted. The engine takes
    references on the returned blocks and never recomputes the last prompt token.
    """


@hookspec
def spyglass_blocks_full(
    request: "Request",
    block_ids: "list[int]",
    num_new: int,
    block_pool: "BlockPool",
    block_size: int,
) -> None:
    """The last ``num_new`` of ``block_ids`` (the request's full blocks, in token order) just filled.

    Block ``i`` holds the KV of tokens ``[i * block_size, (i + 1) * block_size)``. A prefix cache
    registers them here with ``block_pool.cache_block(block_id, hash)``. For a model whose every
    layer slides, leading entries that left the window were already released and name the null
    block (an id outside ``block_pool``, never to be cached); the ``num_new`` last never do.
    """


@hookspec(firstresult=True)
def spyglass_propose_drafts(
    method: str, requests: "tuple[Request, ...]", num_speculative_tokens: int
) -> "dict[str, list[int]] | None":
    """Propose draft tokens to verify in the next step, keyed by ``req_id``; None to propose nothing.

    ``method`` is the configured proposer (``--speculative NAME``): answer only to your own name.
    Called once per step with the running requests that are decoding and have not opted out.
    Each request's drafts follow its last token; the engine trims them to at most
    ``num_speculative_tokens`` and to the request's remaining length, verifies them all in one
    forward and keeps the output distribution unchanged whatever is proposed.
    """


@hookspec
def spyglass_drafts_verified(
    request: "Request", num_draft_tokens: int, num_accepted_tokens: int
) -> None:
    """The request's ``num_draft_tokens`` drafts were verified this step and ``num_accepted_tokens`` accepted.

    Accepted drafts are the leading ones; ``num_accepted_tokens`` per position can be derived
    as positions ``0 .. num_accepted_tokens - 1``.
    """


@hookspec(firstresult=True)
def spyglass_token_constraint(
    spec: "StructuredOutput", tokenizer: "Tokenizer", vocab_size: int
) -> "TokenConstraint | None":
    """Return a fresh `TokenConstraint` (a grammar matcher) enforcing ``spec`` on one request, or None.

    Called when a request whose ``sampling_params.structured_output`` is set is added. ``tokenizer``
    is the engine's; ``vocab_size`` is the width of the model's logits (bitmask rows cover it).
    Raise ``ValueError`` naming the problem for an invalid schema or grammar: the request is
    rejected (HTTP 400). When no plugin returns a constraint the request is rejected too.
    Compile grammars once per distinct spec and cache them: this runs on the engine's thread.
    """


@hookspec(firstresult=True)
def spyglass_reasoning_parser(name: str) -> "ReasoningParser | None":
    """Return the parser of the reasoning format called ``name``, or None if this plugin has none.

    ``deepseek_r1`` and ``qwen3`` are built in (``<think>...</think>`` before the answer), and
    ``mistral`` (Magistral's ``[THINK]...[/THINK]``).

    Asked once when the HTTP server starts with ``--reasoning-parser NAME``: chat and Responses
    answers are then split into the model's reasoning and its content (vLLM's
    ``reasoning_content``), as they are generated (`ReasoningStream`: ``feed`` each new piece of
    text, ``finish`` at the end, getting `ReasoningPiece`s back). Only the content is parsed for
    tool calls.
    """


@hookspec(firstresult=True)
def spyglass_tool_call_parser(name: str) -> "ToolCallParser | None":
    """Return the parser of the tool-call format called ``name``, or None if this plugin has none.

    Built in: ``hermes`` (``<tool_call>{...}</tool_call>``), ``llama3_json`` (Llama 3.1's
    ``{"name": ..., "parameters": {...}}`` answers), ``mistral`` (``[TOOL_CALLS]`` and a JSON
    array, or ``name[ARGS]{...}``), ``qwen3_coder`` (``<function=name><parameter=key>``),
    ``pythonic`` (``[f(a=1), ...]``) and ``phi4_mini_json`` (``functools[{...}]``).

    Asked by the HTTP API when a chat, Messages or Responses request offers tools and leaves the
    choice to the model (``tool_choice`` auto): the parser splits the generated text into content
    and calls. A parser with ``stream()`` parses incrementally (`ToolCallStream`: ``feed`` each new
    piece of text, ``finish`` at the end, getting `ToolCallPiece`s back), so streamed responses send
    a call's name once it is written and its arguments as they are generated; without it a
    choice's text is held until it ends. A parser with ``strict_grammar(arguments, parallel)``
    gives its format as a grammar, so that functions marked ``strict`` hold with ``auto`` (their
    calls' arguments constrained to their schemas); without it such a request is a 400.
    """
