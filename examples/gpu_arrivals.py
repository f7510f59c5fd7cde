"""Steps while requests arrive, for `gpu_check`: at every step a new request's prompt chunk shares
the step with the running requests' decodes; run eagerly, and replayed from packed CUDA graphs
(`EngineConfig.cuda_graph_tokens`; issue 19, item 3)."""

import statistics
import time
from collections import Counter
from dataclasses import dataclass

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.sampling_params import RequestOutputKind, SamplingParams
from spyglass.core.plugin_api import StepStats, hookimpl

PROMPT_LEN, OUTPUT_LEN = 128, 64
# Packed graphs up to the step budget: a prompt of PROMPT_LEN among up to 256 decodes fits.
BUDGET = 512


@dataclass(frozen=True)
class ArrivalRun:
    """The median seconds of an `LLMEngine.step` call while requests arrive (the first 8 left out),
    the output tokens of the whole run and their rate, and the share of its steps that replayed a
    packed graph (`StepStats.forward`)."""

    step_seconds: float
    num_output: int
    output_per_s: float
    packed_share: float


class ForwardTally:
    """Counts an engine's steps by `StepStats.forward`."""

    def __init__(self) -> None:
        self.forwards: Counter[str] = Counter()

    @hookimpl
    def spyglass_step_finished(self, stats: StepStats) -> None:
        self.forwards[stats.forward] += 1


def arrival_run(
    model: str, graph_tokens: int, arrivals: int = 192, device: str = "cuda"
) -> ArrivalRun:
    """One request of `PROMPT_LEN` tokens added before each of ``arrivals`` steps, then the rest
    drained."""
    engine = LLMEngine(
        EngineConfig(
            model=model,
            dtype="bfloat16",
            device=device,
            max_num_seqs=256,
            max_num_batched_tokens=BUDGET,
            cuda_graph_tokens=graph_tokens,
        )
    )
    tally = ForwardTally()
    engine.plugin_manager.register(tally)
    vocab = engine.arch.vocab_size
    params = SamplingParams(
        temperature=0.0,
        max_tokens=OUTPUT_LEN,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    step_seconds, num_output = [], 0
    start = time.perf_counter()
    for index in range(arrivals):
        prompt = [(31 * index + 7 * t) % vocab for t in range(PROMPT_LEN)]
        engine.add_request(str(index), prompt, params)
        step_start = time.perf_counter()
        outputs = engine.step()
        step_seconds.append(time.perf_counter() - step_start)
        num_output += sum(len(o.outputs[0].token_ids) for o in outputs if o.finished)
    while engine.has_unfinished_requests:
        num_output += sum(len(o.outputs[0].token_ids) for o in engine.step() if o.finished)
    seconds = time.perf_counter() - start
    engine.shutdown()
    step = statistics.median(step_seconds[8:] or step_seconds)
    packed = tally.forwards["graph_packed"] / tally.forwards.total()
    return ArrivalRun(step, num_output, num_output / seconds, packed)


def arrival_table(models: dict[str, str]) -> list[str]:
    """`arrival_run` on each shape, eager and with packed graphs up to `BUDGET` tokens."""
    rows = [
        "| shape | eager step ms | eager output tok/s | packed graphs step ms "
        "| packed graphs output tok/s | steps replaying packed graphs |",
        "|---|---|---|---|---|---|",
    ]
    for shape, model in models.items():
        cells = []
        for graph_tokens in (0, BUDGET):
            run = arrival_run(model, graph_tokens)
            cells += [f"{run.step_seconds * 1e3:.2f}", f"{run.output_per_s:,.0f}"]
        cells.append(f"{run.packed_share:.0%}")
        rows.append(f"| {shape} | " + " | ".join(cells) + " |")
    return rows
