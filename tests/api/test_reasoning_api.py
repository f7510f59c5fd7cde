"""``--reasoning-parser``: chat, Responses and Messages answers split into the model's reasoning and
its content, streamed and whole, over both server layouts.

The tiny random model never writes ``<think>`` on its own, so the reasoning comes from the answer's
start: an assistant message the model carries on (``continue_final_message``) and that ``echo``
returns as the answer's beginning, which is split with the rest. With ``deepseek_r1`` the output
starts in the reasoning, so a plain answer is all reasoning.
"""

import json

import anthropic
import openai
import pytest

from tests.api.conftest import LAYOUTS, TINY_ARGS, start_tiny

GREEDY = {"max_tokens": 8, "temperature": 0}
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
QUESTION = {"role": "user", "content": "What is the capital of France?"}


@pytest.fixture(scope="module", params=LAYOUTS)
def servers(request, tiny_llama_dir, tmp_path_factory):
    """A ``qwen3`` and a ``deepseek_r1`` server (both layouts), by parser name."""
    started = {
        name: start_tiny(
            request.param,
            tiny_llama_dir,
            tmp_path_factory.mktemp(f"reasoning_{name}"),
            "--reasoning-parser",
            name,
            # JSON with single spaces only: the random model cannot stall in whitespace
            "--plugin-option",
            "json_whitespace=compact",
        )
        for name in ("qwen3", "deepseek_r1")
    }
    yield started
    for server in started.values():
        server.stop()


def _openai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _chat(client, messages, **extra):
    return client.chat.completions.create(
        model="tiny", messages=messages, **GREEDY, extra_body=extra
    )


def _streamed(client, messages, **extra) -> tuple[str, str]:
    """The reasoning and the content a chat stream assembles to."""
    stream = client.chat.completions.create(
        model="tiny", messages=messages, stream=True, **GREEDY, extra_body=extra
    )
    reasoning, content = [], []
    for chunk in stream:
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
    return "".join(reasoning), "".join(content)


def test_reasoning_then_content_from_the_answer_start(servers):
    client = _openai(servers["qwen3"])
    start = {"role": "assistant", "content": "<think>Paris is in France.</think>The answer:"}
    plain = _chat(
        client, [QUESTION, start], add_generation_prompt=False, continue_final_message=True
    )
    continuation = plain.choices[0].message.content
    assert plain.choices[0].message.model_extra["reasoning_content"] is None

    response = _chat(client, [QUESTION, start], **CONTINUE)
    answer = response.choices[0].message
    assert response.usage.completion_tokens_details.reasoning_tokens == 0  # all generated after
    assert answer.model_extra["reasoning_content"] == "Paris is in France."
    assert answer.content == "The answer:" + continuation
    assert _streamed(client, [QUESTION, start], **CONTINUE) == (
        "Paris is in France.",
        answer.content,
    )


def test_reasoning_cut_by_max_tokens_has_no_content(servers):
    client = _openai(servers["qwen3"])
    start = {"role": "assistant", "content": "<think>Still thinking"}
    response = _chat(client, [QUESTION, start], **CONTINUE)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "length"
    details = response.usage.completion_tokens_details
    assert details.reasoning_tokens == response.usage.completion_tokens == GREEDY["max_tokens"]
    assert message.content is None
    assert message.model_extra["reasoning_content"].startswith("Still thinking")
    assert _streamed(client, [QUESTION, start], **CONTINUE) == (
        message.model_extra["reasoning_content"],
        "",
    )


def test_qwen3_answers_without_think_are_all_content(servers):
    client = _openai(servers["qwen3"])
    response = _chat(client, [QUESTION])
    message = response.choices[0].message
    assert message.content and message.model_extra["reasoning_content"] is None
    assert response.usage.completion_tokens_details.reasoning_tokens == 0


def test_tool_calls_are_parsed_from_the_content_after_the_reasoning(servers):
    client = _openai(servers["qwen3"])
    call = '<tool_call>{"name": "lookup", "arguments": {"city": "Paris"}}</tool_call>'
    start = {"role": "assistant", "content": f"<think>I should look it up.</think>{call}"}
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object"}},
        }
    ]
    response = client.chat.completions.create(
        model="tiny", messages=[QUESTION, start], tools=tools, **GREEDY, extra_body=CONTINUE
    )
    message = response.choices[0].message
    assert message.model_extra["reasoning_content"] == "I should look it up."
    assert [c.function.name for c in message.tool_calls] == ["lookup"]
    assert message.tool_calls[0].function.arguments == '{"city": "Paris"}'


def test_deepseek_r1_output_starts_in_the_reasoning(servers):
    client = _openai(servers["deepseek_r1"])
    response = _chat(client, [QUESTION])
    message = response.choices[0].message
    assert message.content is None and message.model_extra["reasoning_content"]
    assert response.usage.completion_tokens_details.reasoning_tokens == GREEDY["max_tokens"]
    assert _streamed(client, [QUESTION]) == (message.model_extra["reasoning_content"], "")
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[QUESTION],
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == GREEDY["max_tokens"]


def test_constrained_answers_reason_first_unless_their_grammar_is_their_own(servers):
    # As vLLM: a response format holds from the end of the reasoning on. The tiny model never
    # closes its thought, so the JSON never starts: all of it is reasoning, none of it JSON.
    client = _openai(servers["deepseek_r1"])

    def ask(**extra):
        response = client.chat.completions.create(
            model="tiny", messages=[QUESTION], max_tokens=12, temperature=0, **extra
        )
        return response.choices[0].message

    reasoned = ask(response_format={"type": "json_object"})
    assert reasoned.model_extra["reasoning_content"] and reasoned.content is None
    # A grammar of the client's names its own start: it holds from the first token, unsplit.
    grammar = ask(extra_body={"structured_outputs": {"grammar": 'start: "yes" | "no"'}})
    assert grammar.content in ("yes", "no") and grammar.model_extra["reasoning_content"] is None


def test_responses_api_returns_a_reasoning_item(servers):
    client = _openai(servers["deepseek_r1"])
    chat = _chat(client, [QUESTION]).choices[0].message.model_extra["reasoning_content"]
    response = client.responses.create(
        model="tiny", input=QUESTION["content"], max_output_tokens=8, temperature=0
    )
    [item] = response.output
    assert item.type == "reasoning" and item.content[0].text == chat
    assert response.usage.output_tokens_details.reasoning_tokens == response.usage.output_tokens
    events = list(
        client.responses.create(
            model="tiny", input=QUESTION["content"], max_output_tokens=8, temperature=0, stream=True
        )
    )
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == chat
    assert events[-1].response.output[0].content[0].text == chat


def test_messages_api_returns_a_thinking_block(servers):
    client = anthropic.Anthropic(base_url=servers["deepseek_r1"].base_url, api_key="unused")
    chat = _chat(_openai(servers["deepseek_r1"]), [QUESTION]).choices[0].message
    kwargs = dict(model="tiny", max_tokens=8, messages=[QUESTION], extra_body={"temperature": 0})
    message = client.messages.create(**kwargs)
    [block] = message.content
    assert block.type == "thinking" and block.thinking == chat.model_extra["reasoning_content"]
    with client.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert [(b.type, b.thinking) for b in final.content] == [("thinking", block.thinking)]
    # A client sends the thinking block back with the next turn: it is accepted (and left out).
    thought = [
        {"type": "thinking", "thinking": "x", "signature": ""},
        {"type": "text", "text": "Paris."},
    ]
    again = client.messages.create(
        model="tiny",
        max_tokens=4,
        messages=[
            QUESTION,
            {"role": "assistant", "content": thought},
            {"role": "user", "content": "And of Spain?"},
        ],
    )
    assert again.stop_reason == "max_tokens"


@pytest.mark.parametrize(
    "option, kind", [("--reasoning-parser", "reasoning"), ("--tool-call-parser", "tool-call")]
)
def test_an_unknown_parser_stops_the_server_with_the_reason(tiny_llama_dir, option, kind):
    import subprocess
    import sys

    command = [sys.executable, "-m", "spyglass.core.cli.main", "serve", str(tiny_llama_dir),
               *TINY_ARGS, "--port", "0", option, "nope"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode != 0
    assert f"no plugin provides the {kind} parser 'nope'" in result.stdout + result.stderr


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
def test_a_thinking_budget_closes_the_reasoning_in_time(servers, name, hf_gguf_tokenizer):
    # The tiny random model never closes a thought on its own: the text block after the
    # thinking is there because the budget's grammar closed the thought after 6 tokens at most.
    client = anthropic.Anthropic(base_url=servers[name].base_url, api_key="unused")
    request = dict(
        model="tiny",
        max_tokens=24,
        extra_body={"temperature": 0},
        messages=[QUESTION],
        thinking={"type": "enabled", "budget_tokens": 6},
    )
    message = client.messages.create(**request)
    assert [block.type for block in message.content] == ["thinking", "text"]
    thought = message.content[0].thinking
    assert 0 < len(hf_gguf_tokenizer.encode(thought, add_special_tokens=False)) <= 6
    assert message.stop_reason == "max_tokens"
    with client.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    assert [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content
    ] == [
        (b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content
    ]


def test_a_thinking_budget_then_a_json_answer(servers):
    # The budget closes the thought; the format then holds the answer.
    client = anthropic.Anthropic(base_url=servers["qwen3"].base_url, api_key="unused")
    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["Paris", "Lyon"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model="tiny",
        max_tokens=48,
        messages=[QUESTION],
        thinking={"type": "enabled", "budget_tokens": 5},
        extra_body={
            "temperature": 0,
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        },
    )
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking
    assert text.type == "text" and message.stop_reason == "end_turn"
    assert json.loads(text.text)["answer"] in ("Paris", "Lyon")


def test_vllms_thinking_token_budget_limits_a_chat_answers_thought(servers, tiny_client):
    # deepseek_r1 answers start in the thought, which the tiny model never closes by itself.
    client = _openai(servers["deepseek_r1"])

    def ask(**extra):
        response = client.chat.completions.create(
            model="tiny", messages=[QUESTION], max_tokens=40, temperature=0, extra_body=extra
        )
        return response.choices[0].message

    unlimited = ask()
    assert unlimited.content is None  # all of it thought
    limited = ask(thinking_token_budget=5)
    assert limited.model_extra["reasoning_content"] and limited.content
    as_json = ask(thinking_token_budget=5, response_format={"type": "json_object"})
    assert as_json.model_extra["reasoning_content"] and as_json.content.startswith("{")
    with pytest.raises(openai.BadRequestError, match="--reasoning-parser") as error:
        tiny_client.chat.completions.create(
            model="tiny", messages=[QUESTION], max_tokens=4, extra_body={"thinking_token_budget": 5}
        )
    assert error.value.body["param"] == "thinking_token_budget"


@pytest.mark.parametrize(
    "thinking, extra, reason",
    [
        ({"type": "enabled", "budget_tokens": 8}, {}, "max_tokens must be greater"),
        ({"type": "enabled"}, {}, "needs budget_tokens"),
        ({"type": "adaptive", "budget_tokens": 4}, {}, "goes with thinking type enabled"),
    ],
)
def test_a_thinking_budget_that_cannot_hold_is_refused_by_name(servers, thinking, extra, reason):
    client = anthropic.Anthropic(base_url=servers["qwen3"].base_url, api_key="unused")
    with pytest.raises(anthropic.BadRequestError, match=reason) as error:
        client.messages.create(
            model="tiny", max_tokens=8, messages=[QUESTION], thinking=thinking, extra_body=extra
        )
    assert "thinking" in error.value.body["error"]["message"] + str(error.value.body)


def test_thinking_cannot_be_turned_off_without_a_switch(servers):
    # The tiny model's template has no enable_thinking switch: a reasoning model's thinking
    # could not be turned off, and would come back anyway.
    client = anthropic.Anthropic(base_url=servers["qwen3"].base_url, api_key="unused")
    _refuses_then_runs(client, "disabled", "adaptive", "no enable_thinking switch")


def _refuses_then_runs(client, refused: str, accepted: str, reason: str) -> None:
    """A Messages call with ``thinking`` of type ``refused`` is a 400 saying ``reason``; one of
    type ``accepted`` runs."""

    def create(kind: str):
        return client.messages.create(
            model="tiny", max_tokens=2, messages=[QUESTION], thinking={"type": kind}
        )

    with pytest.raises(anthropic.BadRequestError, match=reason):
        create(refused)
    assert create(accepted).stop_reason == "max_tokens"


# Qwen3's switch, in small: a prompt that closes an empty thought when thinking is off.
SWITCH_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)


def test_thinking_disabled_and_adaptive_reach_a_template_with_a_switch(
    tiny_llama_dir, tiny_server, tmp_path
):
    template_file = tmp_path / "switch.jinja"
    template_file.write_text(SWITCH_TEMPLATE)
    server = start_tiny(
        "thread", tiny_llama_dir, tmp_path, "--chat-template", str(template_file),
        "--reasoning-parser", "qwen3",
    )  # fmt: skip
    try:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)

        def counted(**thinking) -> int:
            return client.messages.count_tokens(model="tiny", messages=[QUESTION], **thinking)

        off, adaptive, unset = (
            counted(thinking={"type": "disabled"}).input_tokens,
            counted(thinking={"type": "adaptive"}).input_tokens,
            counted().input_tokens,
        )
        assert off > adaptive == unset  # the closed empty thought is in the prompt
        message = client.messages.create(
            model="tiny", max_tokens=2, messages=[QUESTION], thinking={"type": "disabled"}
        )
        assert message.usage.input_tokens + message.usage.cache_read_input_tokens == off
    finally:
        server.stop()
    # A server without a reasoning parser returns no thinking: adaptive (or a budget) would pretend.
    plain = anthropic.Anthropic(base_url=tiny_server.base_url, api_key="unused", max_retries=0)
    _refuses_then_runs(plain, "adaptive", "disabled", "--reasoning-parser")
    with pytest.raises(anthropic.BadRequestError, match="--reasoning-parser"):
        plain.messages.create(
            model="tiny",
            max_tokens=8,
            messages=[QUESTION],
            thinking={"type": "enabled", "budget_tokens": 4},
        )
