"""``spyglass serve`` telemetry end to end: JSON logs with request ids, a vLLM dashboard's PromQL on a
real Prometheus scraping the server with ``--metrics-namespace vllm``, and traces in a real Phoenix."""

import json
import re
import time
import uuid
from datetime import datetime

import httpx
import openai
import pytest

from tests.telemetry.test_answer_tracing import UNIT

MODEL = "tiny"
SERVE_ARGS = ["--served-model-name", MODEL, "--kv-cache-memory", "64MiB", "--num-threads", "1"]
RATE = "[1m]"  # Grafana's $__rate_interval
METADATA = {"team": "search", "experiment": "b-7"}  # a chat call's own labels
SELECTOR = f'{{model_name="{MODEL}"}}'


def _quantiles(histogram: str) -> list[str]:
    """A vLLM dashboard latency panel: P50/P90/P95/P99 and the mean."""
    queries = [
        f"histogram_quantile({q}, sum by(le) (rate({histogram}_bucket{SELECTOR}{RATE})))"
        for q in (0.5, 0.9, 0.95, 0.99)
    ]
    return queries + [
        f"rate({histogram}_sum{SELECTOR}{RATE}) / rate({histogram}_count{SELECTOR}{RATE})"
    ]


# Written from the metric names vLLM's Grafana dashboard charts (the issue lists them), in its shapes.
VLLM_DASHBOARD = [
    *_quantiles("vllm:e2e_request_latency_seconds"),
    *_quantiles("vllm:time_to_first_token_seconds"),
    *_quantiles("vllm:time_per_output_token_seconds"),
    *_quantiles("vllm:inter_token_latency_seconds"),
    *_quantiles("vllm:request_time_per_output_token_seconds"),
    f"rate(vllm:prompt_tokens_total{SELECTOR}{RATE})",
    f"rate(vllm:generation_tokens_total{SELECTOR}{RATE})",
    f"vllm:num_requests_running{SELECTOR}",
    f"vllm:num_requests_waiting{SELECTOR}",
    f"vllm:kv_cache_usage_perc{SELECTOR}",
    f"vllm:gpu_cache_usage_perc{SELECTOR}",
    f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{SELECTOR}{RATE}))",
    f"sum by(le) (increase(vllm:request_generation_tokens_bucket{SELECTOR}{RATE}))",
    f"sum by(le) (increase(vllm:request_max_num_generation_tokens_bucket{SELECTOR}{RATE}))",
    f"sum by(le) (increase(vllm:request_params_n_bucket{SELECTOR}{RATE}))",
    f"sum by(le) (increase(vllm:request_params_max_tokens_bucket{SELECTOR}{RATE}))",
    f"histogram_quantile(0.5, sum by(le) (rate(vllm:iteration_tokens_total_bucket{SELECTOR}{RATE})))",
    f"sum by(finished_reason) (increase(vllm:request_success_total{SELECTOR}{RATE}))",
    f"rate(vllm:num_preemptions_total{SELECTOR}{RATE})",
    f"rate(vllm:request_queue_time_seconds_sum{SELECTOR}{RATE})",
    f"rate(vllm:request_prefill_time_seconds_sum{SELECTOR}{RATE})",
    f"rate(vllm:request_decode_time_seconds_sum{SELECTOR}{RATE})",
    f"rate(vllm:request_inference_time_seconds_sum{SELECTOR}{RATE})",
    f"vllm:cache_config_info{SELECTOR}",
]


def log_records(server) -> list[dict]:
    """Every line the server wrote, parsed as JSON (fails on the first line that is not)."""
    return [json.loads(line) for line in server.log().splitlines() if line.strip()]


# The engine in the server's thread, and in a process of its own: the same telemetry either way.
ENGINE_PLACES = pytest.mark.parametrize(
    "engine_place", [[], ["--engine-process"]], ids=["engine thread", "engine process"]
)


@ENGINE_PLACES
def test_vllm_dashboard_queries_find_data_and_logs_are_json(
    tiny_llama_dir, server_factory, start_prometheus, engine_place
):
    server = server_factory(
        str(tiny_llama_dir), *SERVE_ARGS, "--metrics-namespace", "vllm", *engine_place
    )
    prometheus = start_prometheus(server.base_url.removeprefix("http://"))
    prometheus.wait_for_scrapes(1)
    # Before the first request, the series are there at zero.
    for query in (
        f"vllm:request_success_total{SELECTOR}",
        f"vllm:e2e_request_latency_seconds_count{SELECTOR}",
    ):
        assert prometheus.api("/api/v1/query", query=query)["data"]["result"], query

    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        chat = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2},
            headers={"X-Request-Id": "client-request-1"},
        )
        completion = client.post(
            "/v1/completions", json={"prompt": "Once upon", "max_tokens": 3, "stream": True}
        )
        missing = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        scrape = client.get("/metrics")
    assert [r.status_code for r in (chat, completion, missing, scrape)] == [200, 200, 404, 200]
    assert chat.headers["x-request-id"] == "client-request-1"
    assert len(completion.headers["x-request-id"]) == 32  # one the server made

    prometheus.wait_for_scrapes(4)
    time.sleep(2.5)  # two more scrapes after the requests, so every rate() has points on both sides
    for query in VLLM_DASHBOARD:
        answer = prometheus.api("/api/v1/query", query=query)
        assert answer["status"] == "success", (query, answer)
        assert answer["data"]["result"], f"no data for {query}"

    records = log_records(server)
    assert {"timestamp", "level", "logger", "event"} <= records[0].keys()
    access = [r for r in records if r["logger"] == "spyglass.access"]
    assert not any(r["path"] == "/metrics" for r in access)  # scrapes are not logged
    (chat_access,) = [r for r in access if r["request_id"] == "client-request-1"]
    assert (chat_access["route"], chat_access["status"]) == ("/v1/chat/completions", 200)
    (missing_access,) = [r for r in access if r["status"] == 404]
    assert missing_access["level"] == "warning" and "does not exist" in missing_access["error"]
    assert missing_access["request_id"] == missing.headers["x-request-id"]
    finished = [r for r in records if r["event"] == "request finished"]
    chat_lines = [r for r in finished if r["request_id"] == "client-request-1"]
    assert sorted(r["req_id"] for r in chat_lines) == [f"{chat.json()['id']}-{i}" for i in range(2)]
    assert all({"trace_id", "span_id"} <= r.keys() for r in finished)


@ENGINE_PLACES
def test_traces_in_phoenix_show_root_spans_errors_and_aborts(
    tiny_llama_dir, server_factory, phoenix, wait_for, engine_place
):
    project = f"spyglass-serve-{uuid.uuid4().hex[:8]}"
    server = server_factory(
        str(tiny_llama_dir),
        *SERVE_ARGS,
        *engine_place,
        "--otlp-traces-endpoint",
        phoenix.http_traces,
        "--trace-content",
        env={"OTEL_SERVICE_NAME": project},
    )
    messages = [{"role": "user", "content": "Tell me about lighthouses"}]
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        chat = client.post(
            "/v1/chat/completions",
            json={
                "messages": messages,
                "max_tokens": 4,
                "user": "legacy-name",
                "safety_identifier": "alice",  # OpenAI's replacement for user: it wins
                "prompt_cache_key": "lighthouse-faq",
                "metadata": METADATA,
            },
            headers={"X-Request-Id": "phoenix-1", "X-Session-Id": "session-1"},
        )
        missing = client.post("/v1/chat/completions", json={"model": "nope", "messages": messages})
        body = {
            "prompt": "Once upon a time",
            "max_tokens": 5000,
            "ignore_eos": True,
            "stream": True,
        }
        with client.stream("POST", "/v1/completions", json=body) as stream:
            next(stream.iter_lines())  # the first chunk, then the client goes away
        aborted = re.compile(
            r'spyglass:request_success_total\{engine="\d+",finished_reason="abort",model_name="tiny"\} 1\.0'
        )
        wait_for(lambda: aborted.search(client.get("/metrics").text), timeout=60)
    assert (chat.status_code, missing.status_code) == (200, 404)
    assert server.stop() == 0  # flushes the spans

    spans = phoenix.spans(
        project, expected=11
    )  # 5 per generation (root, LLM, queue, prefill, decode), the 404
    by_id = {s["context"]["span_id"]: s for s in spans}
    roots = {
        s["attributes"].get("spyglass.http.request_id"): s for s in spans if not s["parent_id"]
    }
    root = roots["phoenix-1"]
    _, trace_id, span_id, _ = chat.headers["traceparent"].split("-")
    assert (root["context"]["trace_id"], root["context"]["span_id"]) == (trace_id, span_id)
    assert root["name"] == "POST /v1/chat/completions" and root["span_kind"] == "CHAIN"
    a = root["attributes"]
    assert json.loads(a["input.value"]) == messages
    assert a["output.value"] == chat.json()["choices"][0]["message"]["content"]
    port = int(server.base_url.split(":")[-1])
    assert (a["user.id"], a["session.id"], a["server.port"]) == ("alice", "session-1", port)
    assert root["status_code"] != "ERROR" and "error.type" not in a
    (llm,) = [s for s in spans if s["parent_id"] == span_id and s["span_kind"] == "LLM"]
    assert llm["name"] == "chat tiny"
    # The call's metadata: OpenInference's on both spans (Phoenix reads the JSON into keys),
    # Langfuse's per key on the root.
    for span in (root, llm):
        attributes = span["attributes"]
        assert {k: v for k, v in attributes.items() if k.startswith("metadata.")} == {
            f"metadata.{key}": value for key, value in METADATA.items()
        }
    assert a["langfuse.trace.metadata.team"] == "search"
    assert llm["attributes"]["user.id"] == "alice"
    assert llm["attributes"]["spyglass.request.prompt_cache_key"] == "lighthouse-faq"
    # The call's handling before the engine had it (template, tokens): inside the root span.
    preprocess = llm["attributes"]["spyglass.request.preprocess_seconds"]
    root_to_llm = datetime.fromisoformat(llm["start_time"]) - datetime.fromisoformat(
        root["start_time"]
    )
    assert 0 < preprocess <= root_to_llm.total_seconds()

    not_found = roots[missing.headers["x-request-id"]]
    assert not_found["attributes"]["error.type"] == "404" and not_found["status_code"] == "UNSET"

    (abort,) = [
        s for s in spans if s["attributes"].get("error.type") == "abort" and s["span_kind"] == "LLM"
    ]
    assert abort["status_code"] == "UNSET"
    parent = by_id[abort["parent_id"]]
    assert datetime.fromisoformat(abort["end_time"]) <= datetime.fromisoformat(parent["end_time"])
    # The HTTP root span says the client left too (not a server error: status unset).
    assert parent["attributes"]["error.type"] == "abort" and parent["status_code"] == "UNSET"

    (line,) = [
        r
        for r in log_records(server)
        if r["event"] == "request finished" and r["request_id"] == "phoenix-1"
    ]
    assert (line["trace_id"], line["span_id"]) == (trace_id, llm["context"]["span_id"])


@ENGINE_PLACES
def test_phoenix_shows_a_call_as_the_client_got_it(
    tiny_llama_dir, server_factory, phoenix, engine_place
):
    project = f"spyglass-calls-{uuid.uuid4().hex[:8]}"
    server = server_factory(
        str(tiny_llama_dir),
        *SERVE_ARGS,
        *engine_place,
        "--otlp-traces-endpoint",
        phoenix.http_traces,
        "--trace-content",
        "--plugin-option",
        "json_whitespace=compact",  # the random model's forced call writes no padding
        env={"OTEL_SERVICE_NAME": project},
    )
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused")
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Which unit?"}],
        tools=[UNIT],
        tool_choice={"type": "function", "function": {"name": "get_unit"}},
        max_tokens=40,
        temperature=0,
    )
    (call,) = reply.choices[0].message.tool_calls
    assert server.stop() == 0  # flushes the spans

    spans = phoenix.spans(project, expected=5)  # root, LLM, queue, prefill, decode
    (root,) = [s for s in spans if not s["parent_id"]]
    (llm,) = [s for s in spans if s["span_kind"] == "LLM"]
    a = llm["attributes"]
    assert a["spyglass.response.num_tool_calls"] == 1
    assert list(a["spyglass.response.tool_names"]) == ["get_unit"]
    traced = "llm.output_messages.0.message.tool_calls.0.tool_call.function"
    assert (a[f"{traced}.name"], a[f"{traced}.arguments"]) == (
        call.function.name,
        call.function.arguments,
    )
    assert root["attributes"]["output.mime_type"] == "application/json"
    (answered,) = json.loads(root["attributes"]["output.value"])["tool_calls"]
    assert answered["function"] == {"name": "get_unit", "arguments": call.function.arguments}
