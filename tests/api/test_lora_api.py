"""LoRA adapters over HTTP: ``model`` names an adapter, answers match PEFT's, adapters load and
unload at run time, and both server layouts (engine thread, engine process) carry the adapter."""

import subprocess
import sys

import httpx
import openai
import pytest
import torch

from tests.api.conftest import LAYOUTS, TINY_ARGS, start_server, start_tiny, wait_for

PROMPT = "The lighthouse keeper counted the ships"
MAX_TOKENS = 12
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, make_lora_adapter) -> dict[str, object]:
    """Two adapters of the tiny Llama: one on every projection, one on q and v only."""
    return {
        "sql": make_lora_adapter(tiny_llama_dir, ALL_PROJECTIONS, seed=1),
        "poet": make_lora_adapter(tiny_llama_dir, ("q_proj", "v_proj"), seed=2, r=4),
    }


@pytest.fixture(scope="module", params=LAYOUTS)
def lora_server(request, tiny_llama_dir, adapters, tmp_path_factory):
    """A server started with the ``sql`` adapter, runtime loading open, in either layout."""
    server = start_tiny(
        request.param,
        tiny_llama_dir,
        tmp_path_factory.mktemp("lora_server"),
        "--dtype",
        "float32",
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--lora-modules",
        f"sql={adapters['sql']}",
        "--allow-runtime-lora",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def peft_text(tiny_llama_dir, hf_gguf_tokenizer):
    """``text(adapter_dir or None)``: PEFT's greedy continuation of `PROMPT` (the base model's for None)."""
    import peft
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([hf_gguf_tokenizer(PROMPT).input_ids])

    def text(adapter_dir) -> str:
        model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)
        if adapter_dir is not None:
            model = peft.PeftModel.from_pretrained(model, adapter_dir)
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=MAX_TOKENS, do_sample=False, min_new_tokens=MAX_TOKENS
            )
        return hf_gguf_tokenizer.decode(out[0, ids.shape[1] :])

    return text


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _complete(client: openai.OpenAI, model: str):
    return client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def _long_stream(server, model: str):
    """A streamed completion of 200 tokens on ``model``: still running when the test looks."""
    return _client(server).completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=200,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )


def test_models_lists_the_adapters_with_their_parent(lora_server, adapters):
    cards = httpx.get(f"{lora_server.base_url}/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["tiny", "sql"]
    assert cards[0]["parent"] is None
    assert cards[1]["parent"] == "tiny"
    assert cards[1]["root"] == str(adapters["sql"])
    # One card by id (the official client's models.retrieve), a 404 naming what is served.
    client = openai.OpenAI(base_url=f"{lora_server.base_url}/v1", api_key="x", max_retries=0)
    assert client.models.retrieve("sql").parent == "tiny"
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="serves `tiny`, `sql`"):
        client.models.retrieve("org/other-model")


def test_an_adapter_answers_as_peft_and_the_base_as_the_model(lora_server, adapters, peft_text):
    client = _client(lora_server)
    adapted = _complete(client, "sql")
    assert adapted.model == "sql"
    assert adapted.choices[0].text == peft_text(adapters["sql"])
    base = _complete(client, "tiny")
    assert base.model == "tiny"
    assert base.choices[0].text == peft_text(None)
    assert base.choices[0].text != adapted.choices[0].text


def test_chat_streams_name_the_adapter_and_match_the_whole_answer(lora_server):
    client = _client(lora_server)
    messages = [{"role": "user", "content": "Name a colour."}]
    whole = client.chat.completions.create(
        model="sql", messages=messages, max_tokens=10, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model="sql", messages=messages, max_tokens=10, temperature=0, stream=True
        )
    )
    assert {c.model for c in chunks} == {"sql"}
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content


def test_unknown_models_are_404s_that_name_what_is_served(lora_server):
    with pytest.raises(openai.NotFoundError) as error:
        _complete(_client(lora_server), "nope")
    assert "`tiny`, `sql`" in str(error.value)


def test_adapters_load_and_unload_at_run_time(lora_server, adapters, peft_text):
    base = lora_server.base_url
    loaded = httpx.post(
        f"{base}/v1/load_lora_adapter",
        json={"lora_name": "poet", "lora_path": str(adapters["poet"])},
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["rank"] == 4
    assert "poet" in [c["id"] for c in httpx.get(f"{base}/v1/models").json()["data"]]
    client = _client(lora_server)
    assert _complete(client, "poet").choices[0].text == peft_text(adapters["poet"])

    again = httpx.post(
        f"{base}/v1/load_lora_adapter",
        json={"lora_name": "poet", "lora_path": str(adapters["poet"])},
    )
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    unloaded = httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "poet"})
    assert unloaded.status_code == 200, unloaded.text
    with pytest.raises(openai.NotFoundError):
        _complete(client, "poet")
    missing = httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "poet"})
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({"lora_name": "x", "lora_path": "/nonexistent"}, "lora_path", "no adapter_config.json"),
        ({"lora_name": "tiny", "lora_path": "/nonexistent"}, "lora_name", "served model"),
        ({"lora_name": "x"}, "lora_path", ""),
    ],
)
def test_bad_loads_are_400s_that_name_the_field(lora_server, body, param, text):
    response = httpx.post(f"{lora_server.base_url}/v1/load_lora_adapter", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert text in error["message"]


def test_a_request_running_when_its_adapter_unloads_finishes(lora_server, adapters):
    base = lora_server.base_url
    httpx.post(
        f"{base}/v1/load_lora_adapter",
        json={"lora_name": "brief", "lora_path": str(adapters["poet"])},
    ).raise_for_status()
    stream = _long_stream(lora_server, "brief")
    chunks = iter(stream)
    first = next(chunks)
    httpx.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": "brief"}).raise_for_status()
    rest = list(chunks)
    assert first.model == "brief"
    assert rest[-1].choices[0].finish_reason == "length"
    kv = wait_for(lambda: (s := httpx.get(f"{base}/debug/kv").json())["num_requests"] == 0 and s)
    assert kv["num_free_blocks"] == kv["num_blocks"]


def test_the_request_view_names_the_adapter(lora_server):
    base = lora_server.base_url
    stream = _long_stream(lora_server, "sql")
    next(iter(stream))
    live = httpx.get(f"{base}/debug/requests").json()
    stream.close()
    assert [r["lora_name"] for r in live] == ["sql"]


def test_runtime_loading_is_closed_by_default(tiny_server):
    response = httpx.post(
        f"{tiny_server.base_url}/v1/load_lora_adapter",
        json={"lora_name": "x", "lora_path": "/tmp"},
    )
    assert response.status_code == 400
    assert "--enable-lora" in response.json()["error"]["message"]


def test_runtime_loading_needs_its_flag(tiny_llama_dir, adapters, tmp_path):
    server = start_server(
        str(tiny_llama_dir), tmp_path, *TINY_ARGS, "--enable-lora", "--max-lora-rank", "8"
    )
    try:
        response = httpx.post(
            f"{server.base_url}/v1/load_lora_adapter",
            json={"lora_name": "x", "lora_path": str(adapters["sql"])},
        )
        assert response.status_code == 403
        assert "--allow-runtime-lora" in response.json()["error"]["message"]
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--enable-lora", "--lora-modules", "no-equals-sign"], "is not NAME=PATH"),
        (["--lora-modules", "a=/x"], "need enable_lora"),
        (["--enable-lora", "--lora-modules", "a=/nonexistent"], "no adapter_config.json"),
    ],
)
def test_bad_lora_options_stop_the_server_with_the_reason(tiny_llama_dir, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "spyglass.core.cli.main", "serve", str(tiny_llama_dir), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert message in result.stderr


def test_lora_modules_take_vllms_two_spellings():
    import argparse

    from spyglass.core.cli.engine_args import lora_module

    assert lora_module("sql=/adapters/sql") == ("sql", "/adapters/sql")
    assert lora_module('{"name": "sql", "path": "/adapters/sql"}') == ("sql", "/adapters/sql")
    with pytest.raises(argparse.ArgumentTypeError, match="name"):
        lora_module('{"path": "/adapters/sql"}')
