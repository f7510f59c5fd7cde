"""A draft engine for proposer plugins: a second engine, owned by one proposer of one target engine.

Each step, every candidate's tokens go in and k greedy tokens come out. The draft engine is a
full engine with its own paged KV cache and its own plugin instances (a scheduling policy and
the prefix cache, so a step recomputes only the draft's newest tokens). Its metrics and traces
are off: its requests are internal and never appear as the target's, or as anyone's. Its id is
the target's with ``-draft`` appended. The proposer that created it stops it (`shutdown`) when
its target stops.
"""

import importlib.metadata
import itertools
from dataclasses import replace

from spyglass.core.engine.config import EngineConfig, dtype_name
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.plugin_manager import ENTRY_POINT_GROUP
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams
from spyglass.core.loaders.checkpoint import Checkpoint

# Scheduling and block reuse; no plugin that reports requests. ``draft_plugins`` overrides.
DEFAULT_DRAFT_PLUGINS = ("fcfs", "prefix_cache")
DRAFT_PLUGINS_OPTION = "draft_plugins"


def draft_config(checkpoint: Checkpoint, target: EngineConfig) -> EngineConfig:
    """The draft engine's configuration: the target's shape, half its KV budget, no telemetry."""
    installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    option = target.plugin_options.get(DRAFT_PLUGINS_OPTION)
    plugins = (
        option.split(",")
        if option
        else [name for name in DEFAULT_DRAFT_PLUGINS if name in installed]
    )
    return EngineConfig(
        model=target.model,
        dtype=dtype_name(next(iter(checkpoint.weights.values())).dtype),
        device=target.device,
        max_model_len=target.max_model_len,
        block_size=target.block_size,
        max_num_seqs=target.max_num_seqs,
        max_num_batched_tokens=max(target.max_num_batched_tokens, 4096),
        kv_cache_memory=target.kv_cache_memory // 2,
        plugins=plugins,
        cuda_graphs=target.cuda_graphs,
        engine_id=f"{target.engine_id}-draft" if target.engine_id else None,
        telemetry=None
        if target.telemetry is None
        else replace(target.telemetry, metrics=False, tracing=False),
        plugin_options={
            k: v for k, v in target.plugin_options.items() if k != DRAFT_PLUGINS_OPTION
        },
    )


class DraftEngine:
    """Proposes drafts by greedy generation on a draft engine built from ``checkpoint`` for ``target``."""

    def __init__(self, checkpoint: Checkpoint, target: EngineConfig):
        self.engine: LLMEngine | None = LLMEngine(
            draft_config(checkpoint, target), checkpoint=checkpoint
        )
        self._ids = itertools.count()

    @property
    def engine_id(self) -> str | None:
        """The draft engine's id (None once stopped)."""
        return self.engine.engine_id if self.engine is not None else None

    def propose(self, requests: tuple[Request, ...], num_tokens: int) -> dict[str, list[int]]:
        """``num_tokens`` greedy draft tokens for each request, from its prompt and output so far."""
        engine = self.engine
        if engine is None:
            return {}
        params = SamplingParams(
            temperature=0.0,
            max_tokens=num_tokens,
            ignore_eos=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        names = {}
        for request in requests:
            draft_id = f"draft-{next(self._ids)}"
            names[draft_id] = request.req_id
            engine.add_request(draft_id, request.all_token_ids, params)
        drafts: dict[str, list[int]] = {}
        while engine.has_unfinished_requests:
            for output in engine.step():
                if output.finished:
                    drafts[names[output.request_id]] = output.outputs[0].token_ids
        return drafts

    def shutdown(self) -> None:
        """Stop the draft engine and let its weights and KV cache go."""
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.shutdown()
