"""Chat templates the operator and the request choose (vLLM's ``--chat-template``,
``--trust-request-chat-template`` and a request's ``chat_template`` and ``documents``): the
prompt the engine sees is the chosen template's rendering, over HTTP (chat, /tokenize,
embeddings) and offline; a request's template needs a server that trusts them."""

import openai
import pytest
import requests

from spyglass.core.engine.sampling_params import SamplingParams
from spyglass.core.llm import LLM
from spyglass.core.tokenizer import Tokenizer
from tests.api.conftest import start_tiny

# The operator's: each message on a line of its own, the documents after them.
SERVER_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}"
    "{% if documents %}{% for d in documents %}[{{ d['title'] }}: {{ d['text'] }}]\n{% endfor %}"
    "{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
# A request's: the messages' contents only, upper-cased.
REQUEST_TEMPLATE = "{% for m in messages %}{{ m['content'] | upper }} {% endfor %}=>"
MESSAGES = [{"role": "user", "content": "where is the fox?"}]
DOCUMENTS = [{"title": "den", "text": "the fox sleeps in its den"}]


@pytest.fixture(scope="module")
def servers(tiny_llama_dir, tmp_path_factory):
    """(a server rendering with SERVER_TEMPLATE from a file that trusts requests' templates, one
    with the model's template that does not)."""
    directory = tmp_path_factory.mktemp("templates")
    template_file = directory / "template.jinja"
    template_file.write_text(SERVER_TEMPLATE)
    options = ["--chat-template", str(template_file), "--trust-request-chat-template"]
    trusting = start_tiny("thread", tiny_llama_dir, directory, *options)
    plain = start_tiny("thread", tiny_llama_dir, directory)
    yield trusting, plain
    trusting.stop()
    plain.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir) -> Tokenizer:
    return Tokenizer.from_hf_dir(tiny_llama_dir)


def _tokens(server, **body) -> list[int]:
    response = requests.post(
        f"{server.base_url}/tokenize", json={"messages": MESSAGES, **body}, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_the_servers_template_and_documents_render_the_prompt(servers, tokenizer):
    trusting, plain = servers
    expected = "<user> where is the fox?\n[den: the fox sleeps in its den]\n<assistant>"
    assert _tokens(trusting, documents=DOCUMENTS) == tokenizer.encode(expected, False)
    assert _tokens(trusting) == tokenizer.encode("<user> where is the fox?\n<assistant>", False)
    model_rendering = tokenizer.apply_chat_template(MESSAGES)
    assert _tokens(plain) == tokenizer.encode(model_rendering, False)
    client = openai.OpenAI(base_url=f"{trusting.base_url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=1,
        extra_body={"documents": DOCUMENTS, "prompt_logprobs": 0},
    )
    assert chat.usage.prompt_tokens == len(tokenizer.encode(expected, False))


def test_a_requests_template_renders_its_prompt_where_the_server_trusts_it(servers, tokenizer):
    trusting, plain = servers
    expected = tokenizer.encode("WHERE IS THE FOX? =>", False)
    assert _tokens(trusting, chat_template=REQUEST_TEMPLATE) == expected
    client = openai.OpenAI(base_url=f"{trusting.base_url}/v1", api_key="x", max_retries=0)
    chat = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=1,
        extra_body={"chat_template": REQUEST_TEMPLATE},
    )
    assert chat.usage.prompt_tokens == len(expected)
    embedded = requests.post(
        f"{trusting.base_url}/v1/embeddings",
        json={"messages": MESSAGES, "chat_template": REQUEST_TEMPLATE},
        timeout=60,
    )
    assert embedded.json()["usage"]["prompt_tokens"] == len(expected)
    for path, extra in (
        ("/v1/chat/completions", {"max_tokens": 1}),
        ("/tokenize", {}),
        ("/v1/embeddings", {}),
    ):
        refused = requests.post(
            f"{plain.base_url}{path}",
            json={"messages": MESSAGES, "chat_template": REQUEST_TEMPLATE, **extra},
            timeout=60,
        )
        assert refused.status_code == 400, path
        error = refused.json()["error"]
        assert (
            error["param"] == "chat_template"
            and "--trust-request-chat-template" in error["message"]
        )
    broken = requests.post(
        f"{trusting.base_url}/v1/chat/completions",
        json={"messages": MESSAGES, "chat_template": "{% for m in messages %}", "max_tokens": 1},
        timeout=60,
    )
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "chat_template"


def test_a_participants_name_reaches_the_template(servers, tokenizer):
    # OpenAI's message ``name`` is in the message the template renders (as vLLM passes it).
    trusting, _ = servers
    named = "{% for m in messages %}{{ m.get('name', 'anon') }}: {{ m['content'] }}\n{% endfor %}"
    messages = [
        {"role": "user", "name": "ada", "content": "hi"},
        {"role": "user", "content": "hello"},
    ]
    tokens = _tokens(trusting, chat_template=named, messages=messages)
    assert tokens == tokenizer.encode("ada: hi\nanon: hello\n", False)


def test_offline_templates(tiny_llama_dir, tmp_path, tokenizer):
    llm = LLM(model=str(tiny_llama_dir), device="cpu", chat_template=SERVER_TEMPLATE)
    greedy = SamplingParams(temperature=0, max_tokens=2)
    [engine_wide] = llm.chat(MESSAGES, greedy)
    assert engine_wide.prompt == "<user> where is the fox?\n<assistant>"
    [own] = llm.chat(MESSAGES, greedy, chat_template=REQUEST_TEMPLATE)
    assert own.prompt == "WHERE IS THE FOX? =>"
    assert own.prompt_token_ids == tokenizer.encode(own.prompt, False)
    with pytest.raises(ValueError, match="neither a file nor a jinja template"):
        LLM(model=str(tiny_llama_dir), device="cpu", chat_template=str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="--chat-template does not compile"):
        LLM(model=str(tiny_llama_dir), device="cpu", chat_template="{% if %}")


def test_reasoning_effort_reaches_a_template_that_reads_it_and_is_refused_elsewhere(
    servers, tokenizer
):
    # OpenAI's reasoning_effort is a template variable (as vLLM passes it to gpt-oss's template);
    # where the template does not read it, it would change nothing: a 400 naming it.
    trusting, plain = servers
    effort_template = (
        "{% if reasoning_effort %}[effort {{ reasoning_effort }}] {% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    client = openai.OpenAI(base_url=f"{trusting.base_url}/v1", api_key="x", max_retries=0)

    def prompt_tokens(**options) -> int:
        chat = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=1,
            extra_body={"chat_template": effort_template},
            **options,
        )
        return chat.usage.prompt_tokens

    rendered = tokenizer.encode("[effort high] where is the fox?", False)
    assert prompt_tokens(reasoning_effort="high") == len(rendered)
    assert prompt_tokens() == len(tokenizer.encode("where is the fox?", False))
    for server, body in (
        (plain, {}),
        (trusting, {}),  # the server's own template does not read it either
        (trusting, {"chat_template": REQUEST_TEMPLATE}),
    ):
        refused = requests.post(
            f"{server.base_url}/v1/chat/completions",
            json={"messages": MESSAGES, "reasoning_effort": "low", "max_tokens": 1, **body},
            timeout=60,
        )
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == "reasoning_effort" and "chat template" in error["message"]


def test_responses_reasoning_effort_reaches_the_servers_template_that_reads_it(
    tiny_llama_dir, tmp_path, tokenizer
):
    # Responses' reasoning.effort is the same template variable, from the server's template.
    template_file = tmp_path / "effort.jinja"
    template_file.write_text(
        "{% if reasoning_effort %}[effort {{ reasoning_effort }}] {% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    server = start_tiny("thread", tiny_llama_dir, tmp_path, "--chat-template", str(template_file))
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)
        question = MESSAGES[0]["content"]
        answer = client.responses.create(
            model="tiny", input=question, max_output_tokens=1, reasoning={"effort": "low"}
        )
        expected = tokenizer.encode(f"[effort low] {question}", False)
        assert answer.usage.input_tokens == len(expected)
        assert answer.reasoning.effort == "low"
        plain = client.responses.create(model="tiny", input=question, max_output_tokens=1)
        assert plain.usage.input_tokens == len(tokenizer.encode(question, False))
    finally:
        server.stop()
