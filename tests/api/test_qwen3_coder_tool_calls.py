"""``--tool-call-parser qwen3_coder`` on a served model: XML-like calls come back as tool calls whose
arguments are typed by the request's own function schemas, streamed and whole.

The tiny random model writes no calls of its own, so the call is the answer's start: an assistant
message the model carries on (``continue_final_message``) and that ``echo`` returns, parsed with
the rest. The template, sent with each request, is a small one in Qwen3-Coder's manner.
"""

import json

import openai
import pytest

from tests.api.conftest import TINY_ARGS, start_server

QWEN3_CODER_STYLE_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call these functions:
{% for tool in tools %}{{ tool.function | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}{% if not loop.last %}<|im_end|>
{% endif %}
{%- endfor %}"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
STARTED_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
CARRY_ON = {
    "chat_template": QWEN3_CODER_STYLE_TEMPLATE,
    "echo": True,
    "continue_final_message": True,
    "add_generation_prompt": False,
}


@pytest.fixture(scope="module")
def client(tiny_llama_dir, tmp_path_factory):
    """The tiny model served with the ``qwen3_coder`` parser; requests bring their template."""
    server = start_server(
        str(tiny_llama_dir),
        tmp_path_factory.mktemp("qwen3_coder"),
        *TINY_ARGS,
        "--tool-call-parser", "qwen3_coder", "--trust-request-chat-template",
    )  # fmt: skip
    yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    server.stop()


def test_a_call_comes_back_typed_by_the_requests_schema_streamed_or_whole(client):
    request = dict(
        model="tiny",
        messages=[
            {"role": "user", "content": "Weather in Paris for 3 days?"},
            {"role": "assistant", "content": STARTED_CALL},
        ],
        tools=TOOLS,
        temperature=0,
        max_tokens=3,
        extra_body=CARRY_ON,
    )
    [call] = client.chat.completions.create(**request).choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # days: integer
    names, fragments = [], []
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                names.append(delta.function.name)
                fragments.append(delta.function.arguments or "")
    assert [name for name in names if name] == ["get_weather"]
    assert "".join(fragments) == call.function.arguments
    # Another request's schema types the same text its own way.
    as_text = json.loads(json.dumps(TOOLS).replace('"integer"', '"string"'))
    [call] = (
        client.chat.completions.create(**{**request, "tools": as_text})
        .choices[0]
        .message.tool_calls
    )
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": "3"}
