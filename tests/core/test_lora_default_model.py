"""A LoRA adapter on the real default model, a GGUF file: Spyglass's tokens and logprobs match
PEFT's on transformers' own reading of the same file, for every projection the adapter changes.

GGUF stores the q and k rows in llama.cpp's order; a PEFT adapter's q and k deltas are in the HF
order, so this checks that the two meet the same way in the engine as in transformers."""

import pytest
import torch

from spyglass import LLM, LoRARequest, SamplingParams
from spyglass.core.cli.bench.random_lora import write_random_lora

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NUM_TOKENS = 8


@pytest.fixture(scope="module")
def llm(default_model_path):
    engine = LLM(
        model=str(default_model_path),
        dtype="float32",
        quantization="none",
        kv_cache_memory="64MiB",
        enable_lora=True,
        max_lora_rank=8,
    )
    return engine


def test_an_adapter_on_the_gguf_model_matches_peft(llm, hf_default_model, tmp_path):
    import peft

    path = write_random_lora(tmp_path / "adapter", llm.engine.arch, rank=8, seed=11)
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0)
    lora = LoRARequest("random", 1, str(path))
    adapted_outputs = llm.generate(PROMPTS, params, use_tqdm=False, lora_request=lora)
    base_outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    reference = peft.PeftModel.from_pretrained(hf_default_model, path).eval()
    try:
        for output, base in zip(adapted_outputs, base_outputs, strict=True):
            prompt, tokens = output.prompt_token_ids, output.outputs[0].token_ids
            with torch.no_grad():
                logits = reference(input_ids=torch.tensor([prompt + tokens])).logits[0]
            logprobs = logits[len(prompt) - 1 : -1].log_softmax(-1)
            assert tokens == logprobs.argmax(-1).tolist()
            ours = torch.tensor([lp.logprob for lp in output.outputs[0].logprobs])
            theirs = logprobs[torch.arange(len(tokens)), torch.tensor(tokens)]
            assert torch.allclose(ours, theirs, atol=2e-3)
            assert tokens != base.outputs[0].token_ids  # the adapter changed the answer
    finally:
        reference.unload()  # the shared reference model goes back to the base weights
