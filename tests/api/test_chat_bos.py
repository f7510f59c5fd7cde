"""A chat template that writes BOS itself (Gemma's, Llama 3's) gets exactly one: the rendered
text is encoded without special tokens, offline and over HTTP, as transformers encodes it, unless
a chat call asks for them (vLLM's ``add_special_tokens``)."""

import json
import shutil

import httpx
import pytest

from spyglass import LLM, SamplingParams
from spyglass.core.tokenizer import Tokenizer

MESSAGES = [{"role": "user", "content": "Hi!"}]


@pytest.fixture(scope="module")
def bos_model_dir(tiny_llama_dir, tmp_path_factory):
    """The tiny Llama with a tokenizer that adds BOS and a template that writes it too."""
    path = tmp_path_factory.mktemp("bos_llama") / "model"
    shutil.copytree(tiny_llama_dir, path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(add_bos_token=True, bos_token="<|endoftext|>")
    config_file.write_text(json.dumps(config))
    template_file = path / "chat_template.jinja"  # where transformers saves the template
    template_file.write_text("{{ bos_token }}" + template_file.read_text())
    return path


def _leading_bos(token_ids: list[int], bos: int) -> int:
    return next((i for i, t in enumerate(token_ids) if t != bos), len(token_ids))


def test_offline_chat_has_one_bos(bos_model_dir):
    llm = LLM(model=str(bos_model_dir), dtype="float32", kv_cache_memory="8MiB", plugins=["fcfs"])
    tokenizer = llm.get_tokenizer()
    bos = tokenizer.bos_token_id
    assert tokenizer.add_bos_token and tokenizer.encode("x")[0] == bos  # plain prompts get it
    [output] = llm.chat(MESSAGES, SamplingParams(max_tokens=2), use_tqdm=False)
    assert _leading_bos(output.prompt_token_ids, bos) == 1


def test_served_chat_and_tokenize_have_one_bos(bos_model_dir, server_factory):
    server = server_factory(str(bos_model_dir), "--served-model-name", "tiny")
    tokenizer = Tokenizer.from_hf_dir(bos_model_dir)
    bos = tokenizer.bos_token_id
    tokenized = httpx.post(f"{server.base_url}/tokenize", json={"messages": MESSAGES}).json()
    assert _leading_bos(tokenized["tokens"], bos) == 1
    plain = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "Hi!"}).json()
    assert plain["tokens"][0] == bos
    bare = {"prompt": "Hi!", "add_special_tokens": False}
    assert httpx.post(f"{server.base_url}/tokenize", json=bare).json()["tokens"][0] != bos
    chat = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={"messages": MESSAGES, "max_tokens": 2, "return_token_ids": True},
        timeout=60,
    ).json()
    assert chat["usage"]["prompt_tokens"] == tokenized["count"]
    assert chat["prompt_token_ids"] == tokenized["tokens"]
    # vLLM's add_special_tokens on chat: the tokenizer's BOS as well as the template's.
    doubled = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={
            "messages": MESSAGES,
            "max_tokens": 2,
            "return_token_ids": True,
            "add_special_tokens": True,
        },
        timeout=60,
    ).json()
    assert doubled["prompt_token_ids"] == [bos, *tokenized["tokens"]]
    # And on completions (default true): a text prompt without the tokenizer's BOS.
    for add, expected in ((True, plain["tokens"]), (False, plain["tokens"][1:])):
        completion = httpx.post(
            f"{server.base_url}/v1/completions",
            json={"prompt": "Hi!", "max_tokens": 1, "return_token_ids": True}
            | ({} if add else {"add_special_tokens": False}),
            timeout=60,
        ).json()
        assert completion["choices"][0]["prompt_token_ids"] == expected
