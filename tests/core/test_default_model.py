"""The real default model (SmolLM2-135M-Instruct, dequantized to float32, greedy) against
transformers, and how requests end on it.

One engine serves the whole module: a batch of 16 varied prompts (English, Chinese, code, chat;
5 to 600 tokens) is generated once and compared with transformers' ``generate`` run one prompt at
a time. Where transformers' top two logits are within 1e-3 either choice is right, so a prompt is
compared only up to its first such near-tie; the count is printed.
"""

import pytest
import torch

from spyglass import LLM, SamplingParams

pytestmark = pytest.mark.slow

NUM_TOKENS = 32
TIE = 1e-3

ESSAY = (
    "The history of computing is a story of abstraction. Early machines were programmed by rewiring "
    "panels of cables, and a single calculation could take days to set up. Stored-program computers "
    "changed that: instructions became data, and data could be loaded from punched cards or magnetic "
    "tape. Assemblers gave names to instructions, compilers turned formulas into machine code, and "
    "operating systems let many programs share one processor. Each layer hid the details of the one "
    "below it, which let programmers think about larger problems. Networks then connected these "
    "machines, first within a building and later across continents. The web made publishing a page "
    "as easy as writing a file, and search engines made those pages findable. Today, large language "
    "models add yet another layer: a person describes what they want in ordinary words, and the "
    "machine proposes code, text or a plan. Whether this layer will be as reliable as a compiler is "
    "an open question. Compilers are deterministic and their outputs can be verified against a "
    "specification, while language models are statistical and their outputs must be checked by "
    "people or by tests. Engineers who build serving systems for these models therefore care about "
    "two things at once: speed, because every token costs time on expensive hardware, and "
    "correctness, because an optimisation that changes the output is a bug, however fast it is."
)

SOURCE = '''"""A small job queue with retries, priorities and a worker pool."""

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger(__name__)


@dataclass(order=True)
class Job:
    """One unit of work; lower priority values run first."""

    priority: int
    sequence: int
    func: Callable = field(compare=False)
    args: tuple = field(default=(), compare=False)
    attempts: int = field(default=0, compare=False)
    max_attempts: int = field(default=3, compare=False)


class JobQueue:
    """A thread-safe priority queue of jobs, drained by a fixed pool of worker threads."""

    def __init__(self, num_workers: int = 4, backoff: float = 0.5):
        self._heap: list[Job] = []
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._counter = itertools.count()
        self._backoff = backoff
        self._stopped = False
        self._workers = [threading.Thread(target=self._work, daemon=True) for _ in range(num_workers)]
        for worker in self._workers:
            worker.start()

    def submit(self, func: Callable, *args, priority: int = 10) -> None:
        """Queue ``func(*args)`` to run on a worker."""
        with self._ready:
            heapq.heappush(self._heap, Job(priority, next(self._counter), func, args))
            self._ready.notify()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._heap and not self._stopped:
                    self._ready.wait()
                if self._stopped:
                    return
                job = heapq.heappop(self._heap)
            try:
                job.func(*job.args)
            except Exception:
                job.attempts += 1
                log.exception("job %s failed (attempt %d)", job.sequence, job.attempts)
                if job.attempts < job.max_attempts:
                    time.sleep(self._backoff * 2 ** job.attempts)
                    with self._ready:
                        heapq.heappush(self._heap, job)
                        self._ready.notify()

'''

CHAT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "你好，请介绍一下你自己。",
    CHAT.format("What is 2 + 2?"),
    "Once upon a time, there was a little robot named",
    "Translate to French: The weather is nice today, so we will walk to the market.",
    "import torch\nimport torch.nn as nn\n\n\nclass MLP(nn.Module):\n    def __init__(self, dim: int, hidden: int):\n",
    "长城是中国古代的军事防御工程，东起山海关，西至嘉峪关，全长两万多公里。它的修建历经了多个朝代，其中明长城保存得最为完整。今天，",
    "List three primary colors:\n1.",
    "SELECT customer_id, COUNT(*) AS num_orders\nFROM orders\nWHERE",
    CHAT.format("用一句话解释什么是机器学习。"),
    '{"name": "Alice", "age": 30, "languages": ["English", "French"], "address": {"city": "Paris", "zip":',
    ESSAY[:700],
    (
        "fn main() {\n    let numbers: Vec<i32> = (1..=10).collect();\n    let evens: Vec<i32> = numbers\n"
        "        .iter()\n        .filter(|n| *n % 2 == 0)\n        .cloned()\n        .collect();\n"
        '    println!("{:?}", evens);\n    let total: i32 ='
    ),
    ESSAY + "\n\nIn one sentence, the main point of this essay is that",
    SOURCE,
]

GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def llm(default_model_path) -> LLM:
    # A 256 MiB KV cache (about 350 blocks) holds the whole batch; the 2 GiB default would only cost memory.
    return LLM(
        model=str(default_model_path),
        dtype="float32",
        quantization="none",
        kv_cache_memory="256MiB",
    )


@pytest.fixture(scope="module")
def ours(llm):
    """Our greedy outputs for every prompt, all submitted in one call."""
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    lengths = [len(o.prompt_token_ids) for o in outputs]
    assert min(lengths) == 5 and 500 <= max(lengths) <= 600
    return outputs


@pytest.fixture(scope="module")
def reference(hf_default_model, ours):
    """transformers' greedy run per prompt: (token ids, log-softmax rows), from the same prompt ids, unpadded."""
    runs = []
    with torch.inference_mode():
        for output in ours:
            input_ids = torch.tensor([output.prompt_token_ids])
            generated = hf_default_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=NUM_TOKENS,
                do_sample=False,
                eos_token_id=None,  # run all 32 tokens, as ignore_eos does
                output_logits=True,
                return_dict_in_generate=True,
            )
            token_ids = generated.sequences[0, input_ids.shape[1] :].tolist()
            assert len(token_ids) == NUM_TOKENS
            logprobs = torch.cat(generated.logits).float().log_softmax(dim=-1)
            runs.append((token_ids, logprobs))
    return runs


def first_tie(logprobs: torch.Tensor) -> int:
    """The first position whose top two logits (equivalently logprobs) are within TIE, else NUM_TOKENS."""
    top = logprobs.topk(2, dim=-1).values
    ties = ((top[:, 0] - top[:, 1]) < TIE).nonzero()
    return int(ties[0]) if len(ties) else NUM_TOKENS


def test_greedy_parity_with_transformers(ours, reference, record_property):
    num_ties, num_compared = 0, 0
    for index, (output, (want, logprobs)) in enumerate(zip(ours, reference)):
        got = output.outputs[0].token_ids
        assert len(got) == NUM_TOKENS and output.outputs[0].finish_reason == "length"
        end = first_tie(logprobs)
        assert got[:end] == want[:end], (
            f"prompt {index} differs from transformers before any near-tie"
        )
        if end < NUM_TOKENS:
            num_ties += 1
            # At the tie itself either of the two is right.
            assert got[end] in logprobs[end].topk(2).indices.tolist()
        num_compared += end
    print(
        f"\nparity: {num_ties} of {len(ours)} prompts reached a near-tie (<{TIE}); {num_compared} tokens compared"
    )
    record_property("near_ties", num_ties)
    record_property("tokens_compared", num_compared)
    assert num_compared >= len(ours) * NUM_TOKENS // 2


def test_logprobs_match_transformers(ours, reference):
    for output, (want, logprobs) in zip(ours, reference):
        completion = output.outputs[0]
        end = first_tie(logprobs)
        for position in range(end):
            ours_lp, theirs = completion.logprobs[position], logprobs[position]
            assert ours_lp.token_id == want[position]
            assert ours_lp.logprob == pytest.approx(float(theirs[want[position]]), abs=1e-3)
            top_values, top_ids = theirs.topk(2)
            assert list(ours_lp.top) == top_ids.tolist()
            assert list(ours_lp.top.values()) == pytest.approx(top_values.tolist(), abs=1e-3)


def test_batching_chunking_paging_and_preemption_leave_outputs_unchanged(
    ours, make_default_engine, run_engine, count_preemptions, same_greedy
):
    # Eight of the prompts (up to ~320 tokens), a new block size, 64-token chunks mixed with decodes,
    # and 48 blocks of 8 (384 slots) for ~1000 tokens of work, so requests get preempted and recomputed.
    chosen = [0, 2, 3, 6, 7, 11, 13, 14]
    engine = make_default_engine(block_size=8, num_kv_blocks=48, max_num_batched_tokens=64)
    preemptions = count_preemptions(engine)
    outputs = run_engine(engine, [ours[i].prompt_token_ids for i in chosen], GREEDY)
    assert preemptions.req_ids, "the KV budget was meant to force preemptions"
    for index, output in zip(chosen, outputs):
        # Logprobs drift ~2e-5 here from float32 sums in another order; a real bug moves them much more.
        same_greedy(ours[index], output, tie=TIE, logprob_tol=1e-3)


def test_eos_ends_generation_unless_ignored(llm, ours):
    eos = llm.get_tokenizer().eos_token_ids[0]
    ending = [o for o in ours if eos in o.outputs[0].token_ids]
    assert ending, "expected some greedy output to reach EOS within 32 tokens"
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS)
    reruns = llm.generate(
        [{"prompt_token_ids": o.prompt_token_ids} for o in ending], params, use_tqdm=False
    )
    for before, after in zip(ending, reruns):
        full = before.outputs[0].token_ids
        completion = after.outputs[0]
        assert completion.token_ids == full[: full.index(eos) + 1]
        assert (completion.finish_reason, completion.stop_reason) == ("stop", None)
        assert "<|im_end|>" not in completion.text


def test_stop_string_spanning_two_tokens(llm, ours):
    tokenizer = llm.get_tokenizer()
    full = ours[1].outputs[0].token_ids  # the fibonacci prompt
    for i in range(1, NUM_TOKENS - 1):
        head, longer = tokenizer.decode(full[:i]), tokenizer.decode(full[: i + 1])
        if "\ufffd" in longer or len(head) < 2 or len(longer) < len(head) + 2:
            continue
        stop = longer[len(head) - 2 : len(head) + 2]
        if stop.strip() and longer.find(stop) == len(head) - 2:
            break
    else:
        pytest.fail("no token boundary to put a stop string across")
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, stop=[stop])
    [output] = llm.generate({"prompt_token_ids": ours[1].prompt_token_ids}, params, use_tqdm=False)
    completion = output.outputs[0]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    assert completion.text == head[:-2]
    assert completion.token_ids == full[: i + 1]
