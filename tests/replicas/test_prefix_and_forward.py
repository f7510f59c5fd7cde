"""The pieces of the replica set that need no Ray: prompt-prefix naming, the table, ASGI forwarding."""

import asyncio
import json

import pytest
import uvicorn
from litestar.testing import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from uvicorn.lifespan.on import LifespanOn

from spyglass.core.api.app import create_app
from spyglass.core.api.kept_ids import CONVERSATION, RESPONSE, keeper_of, new_kept_id, safe_tag
from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig
from spyglass.core.replicas.forward import ForwardedRequest, IngressApp, ResponseStart, call_app
from spyglass.core.replicas.kept_affinity import kept_keeper
from spyglass.core.replicas.prefix import (
    BLOCK_CHARS,
    PrefixTable,
    prefix_blocks,
    routing_blocks,
    routing_text,
)
from spyglass.telemetry import tracing
from spyglass.telemetry.http import TelemetryMiddleware

SYSTEM = "You are a careful assistant. " * 40  # 1,160 characters: 4 full blocks


def _chat(system: str, user: str) -> bytes:
    return json.dumps(
        {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    ).encode()


def test_requests_sharing_a_system_prompt_share_their_leading_block_names():
    first, second = (routing_blocks(_chat(SYSTEM, user)) for user in ("hi", "what is 2+2?"))
    shared = len("system: " + SYSTEM) // BLOCK_CHARS
    assert first[:shared] == second[:shared] and len(first) >= shared
    other = routing_blocks(_chat("Be terse. " + SYSTEM, "hi"))
    assert not set(other) & set(
        first
    )  # names are chained from the start: no match after a difference


def test_routing_text_of_each_request_shape():
    parts = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}
        ]
    }
    assert routing_text(parts) == "user: a"
    anthropic = {"system": "S", "messages": [{"role": "user", "content": "q"}]}
    assert routing_text(anthropic) == "system: S\x1euser: q"
    assert routing_text({"prompt": ["p1", "p2"]}) == "p1"
    assert routing_text({"prompt": [1, 2, 3]}) == "1,2,3"
    assert routing_text({"input": ["e1", "e2"]}) == "e1"  # embeddings
    assert routing_text({"input": [{"role": "user", "content": "r"}]}) == ""  # Responses items
    assert routing_blocks(b"not json") == routing_blocks(b"[1]") == routing_blocks(b"{}") == ()
    assert prefix_blocks("x" * (BLOCK_CHARS - 1)) == ()


def test_the_model_and_the_cache_salt_name_their_own_blocks():
    def names(**fields) -> tuple[int, ...]:
        body = {"messages": [{"role": "system", "content": SYSTEM}], **fields}
        return routing_blocks(json.dumps(body).encode())

    plain, adapter, salted = names(), names(model="sql-lora"), names(cache_salt="tenant-a")
    assert len({plain[0], adapter[0], salted[0]}) == 3
    assert names(model="sql-lora") == adapter  # the same kind shares names
    assert names(cache_salt="sql-lora") != adapter  # a salt is not a model of the same name
    assert routing_blocks(b'{"model": "m"}') == ()  # no prompt, no names


def test_a_prompt_cache_key_names_its_requests_together_whatever_their_prompts():
    def names(key: str | None, user: str) -> tuple[int, ...]:
        body = {"messages": [{"role": "user", "content": user}]}
        return routing_blocks(
            json.dumps(body | ({"prompt_cache_key": key} if key else {})).encode()
        )

    short, other_short = names("docs-bot", "hi"), names("docs-bot", "what is 2+2?")
    assert names(None, "hi") == ()  # a short prompt alone names nothing: any replica will do
    assert short == other_short == short[:1]  # the key's own name, and no full block
    long = names("docs-bot", SYSTEM)
    assert long[0] == short[0] and len(long) > 1
    assert not set(names("sql-bot", SYSTEM)) & set(long)  # another key: routed apart
    assert not set(names(None, SYSTEM)) & set(long)
    table = PrefixTable()
    table.insert(long, "r1")
    assert table.match(short, {"r0", "r1"}) == ("r1", 1)  # the key's replica, prompt unseen


def test_table_answers_the_deepest_live_holder_and_evicts_oldest():
    blocks = prefix_blocks("a" * BLOCK_CHARS * 4)
    table = PrefixTable(capacity=6)
    table.insert(blocks[:2], "r0")
    table.insert(blocks, "r1")  # r1 was sent the whole prompt later: it holds all four
    assert table.match(blocks, {"r0", "r1"}) == ("r1", 4)
    assert table.match(blocks, {"r0"}) is None  # r0's entries were overwritten by r1's
    table.insert(blocks[:1], "r0")
    assert table.match(blocks, {"r0"}) == ("r0", 1)
    table.insert(prefix_blocks("b" * BLOCK_CHARS * 4), "r2")
    assert len(table) == 6
    table.forget("r2")
    assert len(table) == 2


async def _with_lifespan(app, scenario):
    """Run ``scenario()`` while ``app``'s lifespan (the engine) is up, in this event loop."""
    lifespan = LifespanOn(uvicorn.Config(app, lifespan="on", log_config=None))
    await lifespan.startup()
    try:
        return await scenario()
    finally:
        await lifespan.shutdown()


def test_call_app_streams_a_real_app_and_closing_it_aborts_the_request(tiny_llama_dir):
    config = EngineConfig(model=str(tiny_llama_dir), kv_cache_memory=16 << 20, num_threads=1)
    app = create_app(config, ServerOptions(served_model_name="tiny", shutdown_timeout=1))
    body = json.dumps(
        {"prompt": "Once upon", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    ).encode()
    request = ForwardedRequest(
        "POST", "/v1/completions", b"", [(b"content-type", b"application/json")], body
    )

    async def scenario():
        async_engine = app.state.serving.async_engine
        short = ForwardedRequest(
            request.method, request.path, b"", request.headers, body.replace(b"5000", b"3")
        )
        chunks = [
            item async for item in call_app(app, short)
        ]  # ends: the app is told the response went out
        # A listener that lags gets tokens coalesced: 1 to 3 data chunks, the last one ending it.
        assert chunks[-1] == b"data: [DONE]\n\n" and 1 + 1 + 1 <= len(chunks) <= 1 + 3 + 1
        assert b'"finish_reason":"length"' in chunks[-2]
        stream = call_app(app, request, [(b"x-spyglass-replica", b"7")])
        start, first = await anext(stream), await anext(stream)
        running = (await async_engine.snapshot()).num_requests
        await stream.aclose()  # what the ingress does when its client goes away
        for _ in range(100):
            if not (await async_engine.snapshot()).num_requests:
                break
            await asyncio.sleep(0.05)
        return start, first, running, (await async_engine.snapshot()).num_requests

    start, first, running, left = asyncio.run(_with_lifespan(app, scenario))
    assert isinstance(start, ResponseStart) and start.status == 200
    assert (b"x-spyglass-replica", b"7") in start.headers
    assert first.startswith(b"data: ")
    assert (running, left) == (1, 0)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    yield exporter
    tracing.set_tracer_provider(None)


def test_ingress_forwards_with_its_trace_context_and_answers_503_when_no_replica_can(spans):
    seen = []

    async def open_stream(request):
        seen.append(request)
        if len(seen) < 3:
            raise ConnectionError("replica died")
        yield ResponseStart(201, [(b"traceparent", b"replica's"), (b"x-a", b"1")])
        yield b"ok"

    ingress = TelemetryMiddleware(
        IngressApp(open_stream, 1 << 20, (ConnectionError,), frozenset({"/v1/completions"}))
    )
    with TestClient(ingress) as client:
        failed = client.post("/v1/completions", content=_chat(SYSTEM, "hi"))  # two tries, both died
        served = client.post(
            "/v1/completions", content=_chat(SYSTEM, "hi"), headers={"x-request-id": "r1"}
        )
        too_big = client.post("/v1/completions", content=b"x" * (2 << 20))
        metrics = client.get("/metrics")
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "replica_unavailable"
    assert (served.status_code, served.text, served.headers["x-a"]) == (201, "ok", "1")
    assert served.headers["x-request-id"] == "r1"
    ingress_span = next(
        s for s in spans.get_finished_spans() if s.attributes["spyglass.http.request_id"] == "r1"
    )
    assert ingress_span.name == "POST /v1/completions"
    trace_id, span_id = (
        format(ingress_span.context.trace_id, "032x"),
        format(ingress_span.context.span_id, "016x"),
    )
    assert served.headers["traceparent"].startswith(
        f"00-{trace_id}-{span_id}-"
    )  # the ingress's, not the replica's
    forwarded = dict(seen[-1].headers)
    assert forwarded[b"traceparent"] == served.headers["traceparent"].encode()
    assert forwarded[b"x-request-id"] == b"r1"
    assert seen[-1].prefix_blocks == routing_blocks(_chat(SYSTEM, "hi"))
    assert too_big.status_code == 413 and len(seen) == 3
    assert metrics.status_code == 200 and 'route="/v1/completions"' in metrics.text


def test_kept_ids_name_their_keeper_and_calls_about_them_name_it_back():
    tag = safe_tag("aB3xY9")
    plain, tagged = new_kept_id(RESPONSE), new_kept_id(RESPONSE, tag)
    assert plain.startswith("resp_") and keeper_of(plain) is None
    assert tagged.startswith(f"resp_{tag}_") and keeper_of(tagged) == tag
    assert safe_tag("r-1") == b"r-1".hex()  # only letters and digits go in as they are
    for foreign in (None, 7, "", "resp_", "resp_x_", "resp__abc", "resp_a-b_c", "msg_a_b"):
        assert keeper_of(foreign) is None, foreign
    continued = json.dumps({"input": "and then?", "previous_response_id": tagged}).encode()
    assert kept_keeper("POST", "/v1/responses", continued) == tag
    assert kept_keeper("POST", "/v1/responses/input_tokens", continued) == tag  # its count
    assert kept_keeper("POST", "/v1/responses", b'{"input": "hi"}') is None
    assert kept_keeper("POST", "/v1/responses", b"not json") is None
    for method, path in (
        ("GET", f"/v1/responses/{tagged}"),
        ("GET", f"/v1/responses/{tagged}/input_items"),
        ("POST", f"/v1/responses/{tagged}/cancel"),
        ("DELETE", f"/v1/responses/{tagged}"),
    ):
        assert kept_keeper(method, path, b"") == tag, path
    assert kept_keeper("GET", f"/v1/responses/{plain}", b"") is None
    assert kept_keeper("POST", "/v1/chat/completions", continued) is None
    # Conversations: by their id in the path, or in a Responses call's body (a string or an object).
    conversation = new_kept_id(CONVERSATION, tag)
    assert conversation.startswith(f"conv_{tag}_") and keeper_of(conversation) == tag
    for named in (conversation, {"id": conversation}):
        body = json.dumps({"input": "more", "conversation": named}).encode()
        assert kept_keeper("POST", "/v1/responses", body) == tag
    for method, path in (
        ("GET", f"/v1/conversations/{conversation}"),
        ("POST", f"/v1/conversations/{conversation}/items"),
        ("DELETE", f"/v1/conversations/{conversation}/items/msg_1"),
    ):
        assert kept_keeper(method, path, b"") == tag, path
    assert kept_keeper("POST", "/v1/conversations", b"{}") is None  # a new one: any replica


def test_the_ingress_tells_the_router_which_replica_keeps_a_continued_response():
    seen = []

    async def open_stream(request):
        seen.append(request)
        yield ResponseStart(200)

    tagged = new_kept_id(RESPONSE, "k1")
    with TestClient(IngressApp(open_stream, 1 << 20)) as client:
        client.post("/v1/responses", json={"input": "more", "previous_response_id": tagged})
        client.get(f"/v1/responses/{tagged}", params={"stream": "true"})
        client.post("/v1/responses", json={"input": "new"})
    assert [request.keeper for request in seen] == ["k1", "k1", None]
