"""Property-based fuzzing of the HTTP API with schemathesis, over the OpenAPI schema the server publishes.

Bounded to a few hundred cases: valid bodies (every field within its published range) and invalid
ones (wrong types, values out of range, missing fields). None may get a 5xx, and the engine must
stay healthy after every case.
"""

import itertools

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

CHAT_TEMPLATE_FIELDS = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")

# A short context keeps every valid case cheap: max_tokens is bounded by what is left of it.
FUZZ_ARGS = [
    "--served-model-name",
    "tiny",
    "--kv-cache-memory",
    "16MiB",
    "--num-threads",
    "1",
    "--max-model-len",
    "48",
    "--max-queued-requests",
    "256",
]
CASES_PER_OPERATION = {GenerationMode.POSITIVE: 40, GenerationMode.NEGATIVE: 40}


# Per pooling endpoint, what a tamed body sets: one short text (cut to the context where the
# endpoint takes several), and the fields it drops (a second form of input, a vector length).
_POOLING_TAMES = {
    "/v1/embeddings": ({"input": "fuzz"}, ("messages", "dimensions", *CHAT_TEMPLATE_FIELDS)),
    "/v1/score": ({"truncate_prompt_tokens": 8}, ()),
    "/v1/rerank": ({"truncate_prompt_tokens": 8}, ()),
}


# Fields a valid body may hold that this server refuses whatever their value: a second length, a
# reasoning effort (the tiny model's template does not read it) and a prediction (it runs no
# n-gram speculation).
_UNTAMED = ("max_completion_tokens", "reasoning_effort", "reasoning", "prediction")


def _tamed(body, path: str):
    """A valid body made likely to run: the served model, and a length that fits the short context.

    Random valid bodies mostly name another model or ask for more tokens than the context holds;
    sending each one tamed as well makes the fuzzer reach the engine, not only the checks before it.
    """
    if not isinstance(body, dict):
        return body
    tamed = {key: value for key, value in body.items() if key not in _UNTAMED}
    if "model" in tamed:  # the served one (Messages requires a model, the others take it)
        tamed["model"] = "tiny"
    if path in _POOLING_TAMES:
        overrides, dropped = _POOLING_TAMES[path]
        for field in ("text_1", "text_2", "documents"):  # a few texts: each is a request
            if isinstance(tamed.get(field), list):
                tamed[field] = tamed[field][:2]
        return {k: v for k, v in tamed.items() if k not in dropped} | overrides
    tamed["max_output_tokens" if "input" in body else "max_tokens"] = 2
    # One short text in place of each input, however the valid body wrote it: a long one (or a long
    # chat turn, or instructions) overflows the 48-token context, and whether the random bodies
    # hold a short one varies from run to run.
    for field in ("prompt", "input"):  # completions' and responses' inputs
        if field in tamed:
            tamed[field] = "fuzz"
    if "messages" in tamed:
        tamed["messages"] = [{"role": "user", "content": "fuzz"}]
    tamed.pop("instructions", None)
    return tamed


def _operations(base_url: str):
    schema = schemathesis.openapi.from_url(f"{base_url}/schema/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.timeout(600)  # five model endpoints, on a shared 2-core box
def test_no_case_gets_a_server_error(server_factory, tiny_llama_dir):
    base_url = server_factory(str(tiny_llama_dir), *FUZZ_ARGS).base_url
    session = requests.Session()
    seen: dict[tuple[str, GenerationMode], set[int]] = {}
    for operation, mode in itertools.product(_operations(base_url), CASES_PER_OPERATION):
        if mode == GenerationMode.NEGATIVE and not len(operation.body):
            continue  # nothing to get wrong without a body (a path's text is any text)

        @settings(
            max_examples=CASES_PER_OPERATION[mode],
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case):
            for body in (
                (case.body, _tamed(case.body, operation.path))
                if mode == GenerationMode.POSITIVE
                else (case.body,)
            ):
                case.body = body
                response = case.call(base_url=base_url, session=session, timeout=60)
                seen.setdefault((operation.label, mode), set()).add(response.status_code)
                assert response.status_code < 500, (
                    f"{case.method} {case.path} {case.body!r}: {response.text}"
                )
                assert httpx.get(f"{base_url}/health").status_code == 200

        run()
    # The fuzzer reached the generation endpoints, with bodies they ran and bodies they refused.
    for path in (
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/score",
        "/v1/rerank",
    ):
        positive, negative = (seen[(f"POST {path}", mode)] for mode in CASES_PER_OPERATION)
        assert 200 in positive and 400 in negative, (path, positive, negative)
