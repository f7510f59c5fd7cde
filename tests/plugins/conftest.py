"""Plugin-test fixtures: engines on the tiny and the default model with chosen plugins, and a driver."""

import itertools
from collections.abc import Callable, Sequence

import pytest
import torch

from spyglass.core.engine.config import EngineConfig
from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.outputs import RequestOutput
from spyglass.core.engine.plugin_context import PluginContext
from spyglass.core.engine.plugin_manager import create_plugin_manager
from spyglass.core.engine.request import Request
from spyglass.core.engine.sampling_params import SamplingParams, StructuredOutput
from spyglass.core.engine.token_constraint import allowed_tokens, bitmask_words
from spyglass.core.engine.tool_calls import collect
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.load import load_checkpoint
from spyglass.core.tokenizer import Tokenizer
from spyglass.plugins.structured_output import StructuredOutputPlugin

_req_ids = itertools.count()


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_llama_dir) -> Checkpoint:
    """The tiny random Llama in float32, loaded once."""
    return load_checkpoint(str(tiny_llama_dir), torch.float32)


@pytest.fixture(scope="session")
def make_engine(tiny_llama_dir, tiny_checkpoint) -> Callable[..., LLMEngine]:
    """An engine on the tiny Llama (float32, CPU, block size 4); ``plugins`` are entry-point names to enable.

    ``extra`` are plugin objects registered besides them (before the engine asks for its policy).
    """

    def make(plugins=("fcfs", "prefix_cache"), extra=(), **options) -> LLMEngine:
        options = {
            "dtype": "float32",
            "device": "cpu",
            "num_kv_blocks": 64,
            "block_size": 4,
            **options,
        }
        config = EngineConfig(model=str(tiny_llama_dir), plugins=list(plugins), **options)
        pm = create_plugin_manager(
            config.plugins, config.disabled_plugins, PluginContext.for_config(config)
        )
        for plugin in extra:
            pm.register(plugin)
        return LLMEngine(config, plugin_manager=pm, checkpoint=tiny_checkpoint)

    return make


@pytest.fixture(scope="session")
def make_default_engine(default_model_path, default_checkpoint) -> Callable[..., LLMEngine]:
    """An engine on the real default model in float32."""

    def make(plugins=("fcfs", "prefix_cache"), **options) -> LLMEngine:
        options = {"dtype": "float32", "device": "cpu", "num_kv_blocks": 128, **options}
        config = EngineConfig(model=str(default_model_path), plugins=list(plugins), **options)
        return LLMEngine(config, checkpoint=default_checkpoint)

    return make


def add(
    engine: LLMEngine, prompt: Sequence[int], params: SamplingParams | None = None, **attributes
) -> Request:
    """Queue one greedy request with a fresh id."""
    params = params or SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    return engine.add_request(f"req-{next(_req_ids)}", list(prompt), params, attributes=attributes)


def drain(
    engine: LLMEngine, check_integrity: bool = True, max_steps: int = 5000
) -> dict[str, RequestOutput]:
    """Step until nothing is left, checking the KV bookkeeping after every step; final outputs by id."""
    finished: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests:
            break
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output
        if check_integrity:
            engine.kv.check_integrity()
    assert not engine.has_unfinished_requests, f"not done after {max_steps} steps"
    return finished


@pytest.fixture(scope="session")
def driver():
    """`add` and `drain` as a namespace: ``driver.add(engine, prompt)``, ``driver.drain(engine)``."""

    class Driver:
        pass

    Driver.add = staticmethod(add)
    Driver.drain = staticmethod(drain)
    return Driver


@pytest.fixture(scope="session")
def grammar_accepts(tiny_llama_dir) -> Callable[[str, str], bool]:
    """``accepts(grammar, text)``: whether an llguidance grammar (Lark) lets every one of the tiny
    vocabulary's tokens of ``text`` through, token by token, as it masks a model's: each token
    allowed by the step's mask, then accepted."""
    tokenizer = Tokenizer.from_hf_dir(tiny_llama_dir)
    plugin = StructuredOutputPlugin()

    def accepts(grammar: str, text: str) -> bool:
        constraint = plugin.spyglass_token_constraint(
            StructuredOutput("grammar", grammar), tokenizer, tokenizer.vocab_size
        )
        for token_id in tokenizer.encode(text, False):
            mask = torch.zeros((1, bitmask_words(tokenizer.vocab_size)), dtype=torch.int32)
            constraint.fill_bitmask(mask, 0)
            if not allowed_tokens(mask, tokenizer.vocab_size)[0, token_id]:
                return False
            if not constraint.accept(token_id):
                return False
        return True

    return accepts


def parse_in_pieces(parser, text: str, size: int) -> tuple[str | None, list]:
    """What ``parser``'s stream assembles to when ``text`` arrives ``size`` characters at a time."""
    stream = parser.stream()
    pieces = [p for i in range(0, len(text), size) for p in stream.feed(text[i : i + size])]
    return collect(pieces + stream.finish())
