"""``--tool-call-parser mistral`` and ``--reasoning-parser mistral`` on a served model: calls parsed
in both layouts, Magistral's ``[THINK]`` reasoning split off, special tokens kept for the parsers,
and earlier calls' ids written as Mistral's templates demand.

The tiny random model writes no calls of its own, so the call is the answer's start: an assistant
message the model carries on (``continue_final_message``) and that ``echo`` returns, parsed with
the rest. The template, sent with each request, is a small one in Mistral's manner: it refuses
call ids that are not 9 letters and digits, as Mistral's own do.
"""

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import TINY_ARGS, start_server

MISTRAL_STYLE_TEMPLATE = """\
{%- for message in messages %}
{%- if message.role == "user" %}\
{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}\
[INST]{{ message.content }}[/INST]
{%- elif message.tool_calls %}[TOOL_CALLS][\
{% for call in message.tool_calls %}\
{% if call.id | length != 9 %}{{ raise_exception("call ids are 9 letters and digits") }}{% endif %}\
{{ {"name": call.function.name, "arguments": call.function.arguments, "id": call.id} | tojson }}\
{% if not loop.last %}, {% endif %}{% endfor %}]</s>
{%- elif message.role == "tool" %}\
{% if message.tool_call_id | length != 9 %}{{ raise_exception("call ids are 9 letters and digits") }}{% endif %}\
[TOOL_RESULTS]{{ {"content": message.content, "call_id": message.tool_call_id} | tojson }}[/TOOL_RESULTS]
{%- elif message.role == "assistant" %}{{ message.content }}{% if not loop.last %}</s>{% endif %}
{%- endif %}
{%- endfor %}"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = {"role": "user", "content": "What will the weather be in Paris?"}
TEMPLATE = {"chat_template": MISTRAL_STYLE_TEMPLATE}
CARRY_ON = {
    **TEMPLATE,
    "echo": True,
    "continue_final_message": True,
    "add_generation_prompt": False,
}


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    """The tiny model served with the ``mistral`` tool-call parser; requests bring their template."""
    started = start_server(
        str(tiny_llama_dir),
        tmp_path_factory.mktemp("mistral"),
        *TINY_ARGS,
        "--tool-call-parser", "mistral", "--trust-request-chat-template",
    )  # fmt: skip
    yield started
    started.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def magistral_client(tiny_llama_dir, tmp_path_factory):
    """The same with the ``mistral`` reasoning parser too."""
    started = start_server(
        str(tiny_llama_dir),
        tmp_path_factory.mktemp("magistral"),
        *TINY_ARGS,
        "--tool-call-parser", "mistral", "--reasoning-parser", "mistral",
        "--trust-request-chat-template",
    )  # fmt: skip
    yield openai.OpenAI(base_url=f"{started.base_url}/v1", api_key="unused", max_retries=0)
    started.stop()


def _special_token(tokenizer) -> tuple[int, str]:
    """A special token of the tiny vocabulary (not EOS) and its text."""
    special = next(t for t in tokenizer.all_special_ids if t != tokenizer.eos_token_id)
    return special, tokenizer.decode([special], skip_special_tokens=False)


def _forced_answer(client, special: int, **extra) -> str | None:
    """The content of two tokens, both ``special``."""
    response = client.chat.completions.create(
        model="tiny",
        messages=[ASK],
        max_tokens=2,
        logit_bias={str(special): 100},
        extra_body=TEMPLATE,
        **extra,
    )
    return response.choices[0].message.content


@pytest.mark.parametrize(
    "started",
    [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
    ],
    ids=["v3 array", "v11 name[ARGS]"],
)
def test_a_call_in_either_layout_comes_back_as_a_tool_call_streamed_or_whole(client, started):
    request = dict(
        model="tiny",
        messages=[ASK, {"role": "assistant", "content": started}],
        tools=TOOLS,
        temperature=0,
        max_tokens=3,
        extra_body=CARRY_ON,
    )
    message = client.chat.completions.create(**request).choices[0].message
    [call] = message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    names, fragments, content = [], [], []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                names.append(delta.function.name)
                fragments.append(delta.function.arguments or "")
    assert [name for name in names if name] == ["get_weather"]
    assert "".join(fragments) == call.function.arguments
    assert "".join(content) == (message.content or "")  # the tiny model's text after the call


def test_answers_parsed_for_calls_keep_special_tokens_text(client, hf_gguf_tokenizer):
    # [TOOL_CALLS] is a special token in Mistral's vocabularies: skipped, the parser would
    # never see it. A special token of the tiny vocabulary shows the same.
    special, text = _special_token(hf_gguf_tokenizer)
    assert _forced_answer(client, special, tools=TOOLS) == text * 2
    # Answers no tool-call parser reads skip them, as always.
    assert _forced_answer(client, special) == ""
    assert _forced_answer(client, special, tools=TOOLS, tool_choice="none") == ""


def test_magistral_reasoning_is_split_off_and_keeps_special_tokens(
    magistral_client, hf_gguf_tokenizer
):
    # [THINK] and [/THINK] are special tokens too: every answer the reasoning parser splits
    # keeps their text, with tools or without.
    special, text = _special_token(hf_gguf_tokenizer)
    assert _forced_answer(magistral_client, special) == text * 2
    started = "[THINK]The user wants the weather.[/THINK][TOOL_CALLS]get_weather[ARGS]{}"
    message = (
        magistral_client.chat.completions.create(
            model="tiny",
            messages=[ASK, {"role": "assistant", "content": started}],
            tools=TOOLS,
            max_tokens=1,
            extra_body=CARRY_ON,
        )
        .choices[0]
        .message
    )
    assert message.model_extra["reasoning_content"] == "The user wants the weather."
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_weather", "{}")
    ]


def test_the_formats_read_are_in_the_metrics(server):
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    [family] = [
        f for f in text_string_to_metric_families(text) if f.name == "spyglass:server_config_info"
    ]
    [sample] = family.samples
    assert (sample.labels["tool_call_parser"], sample.labels["reasoning_parser"]) == (
        "mistral",
        "none",
    )


def test_earlier_calls_reach_the_template_with_ids_it_accepts(client, server, hf_gguf_tokenizer):
    call_id = "call_48b3157aefed47889241f75c"  # as this server (OpenAI style) writes them
    history = [
        ASK,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]
    answer = client.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, max_tokens=2, extra_body=TEMPLATE
    )
    assert answer.choices[0].finish_reason == "length"
    tokenized = httpx.post(
        f"{server.base_url}/tokenize", json={"model": "tiny", "messages": history, **TEMPLATE}
    )
    tokens = tokenized.raise_for_status().json()["tokens"]
    prompt = hf_gguf_tokenizer.decode(tokens)
    assert '"id": "89241f75c"' in prompt
    assert '"call_id": "89241f75c"' in prompt
