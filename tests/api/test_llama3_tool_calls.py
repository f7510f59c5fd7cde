"""``--tool-call-parser llama3_json`` on a served model: Llama 3.1's JSON calls come back as tool calls.

The default model was not trained on Llama 3's format, so the call is started for it: the answer
begins with an assistant message the model carries on (``continue_final_message``) and that
``echo`` returns as the answer's start, parsed with the rest. The template is a small one in
Llama 3.1's manner (tools listed up front, calls written as JSON objects), sent with the request.
"""

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import start_server

LLAMA3_STYLE_TEMPLATE = """\
{%- for message in messages %}
{%- if loop.first and tools %}<|im_start|>system
When a function helps, answer only with {"name": function name, "parameters": its arguments}.
{% for tool in tools %}{{ tool.function | tojson }}
{% endfor %}<|im_end|>
{% endif %}
{%- if message.tool_calls %}<|im_start|>assistant
{% for call in message.tool_calls %}\
{{ {"name": call.function.name, "parameters": call.function.arguments} | tojson }}\
{% if not loop.last %}; {% endif %}{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>ipython
{{ message.content }}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "kelvin"]}},
                "required": ["city", "unit"],
            },
        },
    }
]
ASK = {"role": "user", "content": "What will the weather be in Paris tomorrow, in celsius?"}
STARTED_CALL = {
    "role": "assistant",
    "content": '{"name": "get_weather", "parameters": {"unit": "celsius", "city": "',
}
CARRY_ON = {
    "echo": True,
    "continue_final_message": True,
    "add_generation_prompt": False,
    "chat_template": LLAMA3_STYLE_TEMPLATE,
}


@pytest.fixture(scope="module")
def client(default_model_path, tmp_path_factory):
    """The default model served with the ``llama3_json`` parser; requests bring their template."""
    server = start_server(
        str(default_model_path),
        tmp_path_factory.mktemp("llama3_json"),
        "--served-model-name", "smol", "--tool-call-parser", "llama3_json",
        "--trust-request-chat-template",
    )  # fmt: skip
    yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    server.stop()


def _ask(client, **extra):
    return client.chat.completions.create(
        model="smol",
        messages=[ASK, STARTED_CALL],
        tools=TOOLS,
        temperature=0,
        max_tokens=40,
        extra_body=CARRY_ON,
        **extra,
    )


def _tool_calls_counted(client, format_name: str) -> float:
    """``spyglass:tool_calls_total`` for ``format_name``, read from the server's /metrics."""
    text = httpx.get(str(client.base_url).removesuffix("/v1/") + "/metrics", timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "spyglass:tool_calls_total" and sample.labels["format"] == format_name
    )


def test_the_model_finishes_a_json_call_that_comes_back_as_a_tool_call(client):
    counted = _tool_calls_counted(client, "llama3_json")
    choice = _ask(client).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    # The model wrote the city and closed the call.
    assert json.loads(call.function.arguments) == {"unit": "celsius", "city": "Paris"}
    names, fragments = [], []
    for chunk in _ask(client, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            names.append(delta.function.name)
            fragments.append(delta.function.arguments or "")
    assert [name for name in names if name] == ["get_weather"]
    assert "".join(fragments) == call.function.arguments
    # Both answers' calls are counted by the format they were read in.
    assert _tool_calls_counted(client, "llama3_json") == counted + 2


def test_tools_a_template_cannot_show_in_the_parsed_format_are_a_400(client):
    # The default model's own template renders no tools, so the server would list them in the
    # Hermes format, which this server does not parse: every call would come back as content.
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="smol", messages=[ASK], tools=TOOLS, max_tokens=4)
    assert error.value.body["param"] == "tools"
    assert "llama3_json" in error.value.body["message"]
    forced = client.chat.completions.create(
        model="smol", messages=[ASK], tools=TOOLS, tool_choice="required", max_tokens=60
    )  # the grammar writes calls whatever format the prompt asks for
    assert forced.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert _tool_calls_counted(client, "json") >= 1  # written by the grammar
