"""Drafting with a second Spyglass engine: each step, every candidate's tokens go in, k greedy tokens come out.

The draft engine is a full engine with its own paged KV cache; with the prefix-cache plugin
its earlier blocks are reused, so a step recomputes only the draft's newest tokens.
"""

import importlib.metadata
import itertools

from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.plugin_manager import ENTRY_POINT_GROUP
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams

# The draft engine's own plugins: scheduling and block reuse, no telemetry of its internal requests.
_DRAFT_PLUGINS = ("fcfs", "prefix_cache")


class EngineDrafter:
    """Proposes drafts by greedy generation on a draft engine built from ``checkpoint``."""

    def __init__(self, checkpoint: Checkpoint, target: EngineConfig):
        installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        config = EngineConfig(
            model=target.model,
            dtype=str(next(iter(checkpoint.weights.values())).dtype).removeprefix("torch."),
            device=target.device,
            max_model_len=target.max_model_len,
            block_size=target.block_size,
            max_num_seqs=target.max_num_seqs,
            max_num_batched_tokens=max(target.max_num_batched_tokens, 4096),
            kv_cache_memory=target.kv_cache_memory // 2,
            plugins=[name for name in _DRAFT_PLUGINS if name in installed],
            cuda_graphs=target.cuda_graphs,
        )
        self.engine = LLMEngine(config, checkpoint=checkpoint)
        self._ids = itertools.count()

    def propose(self, requests: tuple[Request, ...], num_tokens: int) -> dict[str, list[int]]:
        """``num_tokens`` greedy draft tokens for each request, from its prompt and output so far."""
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
        names = {}
        for request in requests:
            draft_id = f"draft-{next(self._ids)}"
            names[draft_id] = request.req_id
            self.engine.add_request(draft_id, request.all_token_ids, params)
        drafts: dict[str, list[int]] = {}
        while self.engine.has_unfinished_requests:
            for output in self.engine.step():
                if output.finished:
                    drafts[names[output.request_id]] = output.outputs[0].token_ids
        return drafts
