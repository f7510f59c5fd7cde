"""Two tiny engine replicas on a local Ray cluster behind the ingress: prefix routing, streams and aborts,
traces across the hop, replica labels, and a killed replica that Ray replaces while the other serves."""

import json
import os
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest
from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from spyglass.core.api.app import create_app  # noqa: E402
from spyglass.core.api.kept_ids import safe_tag  # noqa: E402
from spyglass.core.api.server_options import ServerOptions  # noqa: E402
from spyglass.core.engine.config import EngineConfig  # noqa: E402
from spyglass.core.replicas.deployments import build_application  # noqa: E402
from spyglass.core.replicas.router import PrefixAffinityRouter  # noqa: E402
from spyglass.telemetry import settings as telemetry_settings  # noqa: E402

APP = "spyglass-test"
SYSTEM_PROMPTS = [  # two long system prompts (about 90 tokens each, several KV blocks), three questions each
    "You are Ada, a meticulous assistant for a railway company. Answer questions about timetables, fares, "
    "platforms and delays. Always state the station names in full and never guess a platform number. "
    * 3,
    "You are Bo, a patient tutor of elementary geometry. Explain each step, name every theorem you use, "
    "and finish with a one-sentence summary that a ten-year-old could follow without any drawing. "
    * 3,
]
QUESTIONS = ["When is the next train?", "How much is a return ticket?", "Is the 9:15 late?"]


def _requests() -> list[dict]:
    """Interleaved: A1, B1, A2, B2, A3, B3."""
    return [
        {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_tokens": 2,
            "temperature": 0,
        }
        for question in QUESTIONS
        for system in SYSTEM_PROMPTS
    ]


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + count < 65536 and all(_is_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no consecutive free ports")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class _OtlpReceiver(BaseHTTPRequestHandler):
    spans: ClassVar[list] = []

    def do_POST(self):
        request = ExportTraceServiceRequest.FromString(
            self.rfile.read(int(self.headers["Content-Length"]))
        )
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@dataclass
class Cluster:
    base_url: str
    replica_port: int

    def replica_url(self, rank: str | int) -> str:
        return f"http://127.0.0.1:{self.replica_port + int(rank)}"

    def prefix_counts(self) -> dict[str, tuple[float, float]]:
        """Per replica label: (prefix-cache queries, hits), scraped from each replica's own port."""
        counts = {}
        for rank in (0, 1):
            text = httpx.get(f"{self.replica_url(rank)}/metrics", timeout=10).text
            samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
            assert samples and all(s.labels.get("replica") == str(rank) for s in samples)
            total = defaultdict(float)
            for s in samples:
                total[s.name] += s.value
            counts[str(rank)] = tuple(
                total[f"spyglass:prefix_cache_{name}_total"] for name in ("queries", "hits")
            )
        return counts


ENGINE = dict(kv_cache_memory=32 << 20, num_threads=1, dtype="float32")


@pytest.fixture(scope="module")
def cluster(tiny_llama_dir):
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # replicas export spans within 0.1 s
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ[
            "PYTHONPATH"
        ]  # spyglass from this checkout when it is not installed
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=128 << 20,
        runtime_env={"env_vars": env},
    )
    port, replica_port = _free_ports(1), _free_ports(2)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    telemetry = telemetry_settings.TelemetrySettings(
        otlp_traces_endpoint=f"http://127.0.0.1:{receiver.server_port}"
    )
    options = ServerOptions(
        host="127.0.0.1", port=port, served_model_name="tiny", shutdown_timeout=2
    )
    application = build_application(
        EngineConfig(model=str(tiny_llama_dir), **ENGINE),
        options,
        telemetry,
        num_replicas=2,
        replica_port=replica_port,
    )
    serve.run(application, name=APP, route_prefix="/")
    yield Cluster(f"http://127.0.0.1:{port}", replica_port)
    serve.shutdown()
    ray.shutdown()
    receiver.shutdown()


def single_engine_hit_rate(model_dir) -> float:
    """The prefix-cache hit rate of one engine (the same app, in this process) on the same requests."""
    from prometheus_client import REGISTRY

    def counts():
        samples = [s for family in REGISTRY.collect() for s in family.samples]
        return [
            sum(s.value for s in samples if s.name == f"spyglass:prefix_cache_{name}_total")
            for name in ("queries", "hits")
        ]

    config = EngineConfig(model=str(model_dir), **ENGINE)
    with TestClient(create_app(config, ServerOptions(served_model_name="tiny"))) as client:
        before = counts()
        for body in _requests():
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        queries, hits = (after - b for after, b in zip(counts(), before))
    return hits / queries


def _stand_in_router():
    """A `PrefixAffinityRouter` (``max_load_gap`` 2) outside Ray Serve, and three stand-in replicas."""
    from types import SimpleNamespace

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID
    from ray.serve.request_router import ReplicaID

    deployment = DeploymentID("EngineReplica", APP)
    router = PrefixAffinityRouter(
        deployment, DeploymentHandleSource.UNKNOWN, use_replica_queue_len_cache=True
    )
    router.initialize_state(max_load_gap=2)
    return router, [SimpleNamespace(replica_id=ReplicaID(f"r{i}", deployment)) for i in range(3)]


def test_router_prefers_the_prefix_holder_unless_its_queue_is_too_long():
    """The router alone, with stand-in replicas: affinity, the load fallback, and a dead replica forgotten."""
    import asyncio

    from ray.serve.request_router import PendingRequest

    from spyglass.core.replicas.forward import ForwardedRequest
    from spyglass.core.replicas.prefix import routing_blocks

    async def scenario():
        router, replicas = _stand_in_router()
        body = json.dumps(_requests()[0]).encode()
        request = ForwardedRequest(
            "POST", "/v1/chat/completions", b"", [], body, routing_blocks(body)
        )
        pending = PendingRequest(args=[request], kwargs={}, metadata=None)
        (first,) = await router.choose_replicas(replicas, pending)  # nobody has it: two at random
        assert len(first) == 2
        router.on_request_routed(pending, replicas[1].replica_id, None)
        assert await router.choose_replicas(replicas, pending) == [
            [replicas[1]],
            [replicas[0], replicas[2]],
        ]
        for replica, queue_len in zip(replicas, (0, 3, 1)):
            router._replica_queue_len_cache.update(replica.replica_id, queue_len)
        assert len((await router.choose_replicas(replicas, pending))[0]) == 2  # 3 - 0 > 2: by load
        router._replica_queue_len_cache.update(replicas[1].replica_id, 2)
        assert (await router.choose_replicas(replicas, pending))[0] == [
            replicas[1]
        ]  # 2 - 0 <= 2: affinity
        router.on_replica_actor_died(replicas[1].replica_id)
        assert len(router.table) == 0

    asyncio.run(scenario())


def test_router_sends_a_call_about_a_kept_response_to_its_keeper_alone():
    """Stand-in replicas: the keeper wins over the prefix holder and however long its queue; a
    dead keeper's calls go by the usual policy; each routed request is counted by its reason."""
    import asyncio

    from ray.serve.request_router import PendingRequest

    from spyglass.core.api.kept_ids import RESPONSE, new_kept_id
    from spyglass.core.replicas.forward import ForwardedRequest
    from spyglass.core.replicas.kept_affinity import kept_keeper
    from spyglass.core.replicas.prefix import routing_blocks
    from spyglass.telemetry.metrics import REPLICA_ROUTES

    def routed(reason: str) -> float:
        return REPLICA_ROUTES.labels(reason)._value.get()

    async def scenario():
        router, replicas = _stand_in_router()
        kept = new_kept_id(RESPONSE, safe_tag("r2"))
        body = json.dumps({"input": SYSTEM_PROMPTS[0], "previous_response_id": kept}).encode()
        continuation = ForwardedRequest(
            "POST",
            "/v1/responses",
            b"",
            [],
            body,
            routing_blocks(body),
            keeper=kept_keeper("POST", "/v1/responses", body),
        )
        pending = PendingRequest(args=[continuation], kwargs={}, metadata=None)
        before = {reason: routed(reason) for reason in ("kept_response", "prefix", "load")}
        router.table.insert(continuation.prefix_blocks, "r0")  # r0 has the prompt's prefix
        for replica, queue_len in zip(replicas, (0, 0, 9)):  # and the keeper, r2, is busy
            router._replica_queue_len_cache.update(replica.replica_id, queue_len)
        # With the keeper gone from the live ones: the prefix holder, as for any other request.
        assert (await router.choose_replicas(replicas[:2], pending))[0] == [replicas[0]]
        router.on_request_routed(pending, replicas[0].replica_id, None)
        assert await router.choose_replicas(replicas, pending) == [[replicas[2]]]
        router.on_request_routed(pending, replicas[2].replica_id, None)
        fresh = ForwardedRequest("POST", "/v1/responses", b"", [], b"{}")
        router.on_request_routed(
            PendingRequest(args=[fresh], kwargs={}, metadata=None), replicas[1].replica_id, None
        )
        after = {reason: routed(reason) - before[reason] for reason in before}
        assert after == {"kept_response": 1, "prefix": 1, "load": 1}

    asyncio.run(scenario())


def test_requests_sharing_a_system_prompt_go_to_the_replica_that_has_it(cluster, tiny_llama_dir):
    before = cluster.prefix_counts()
    served_by = defaultdict(set)
    with httpx.Client(base_url=cluster.base_url, timeout=120) as client:
        for body in _requests():
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["role"] == "assistant"
            served_by[body["messages"][0]["content"]].add(response.headers["x-spyglass-replica"])
    assert all(len(replicas) == 1 for replicas in served_by.values()), served_by
    after = cluster.prefix_counts()
    queries = sum(after[r][0] - before[r][0] for r in after)
    hits = sum(after[r][1] - before[r][1] for r in after)
    single = single_engine_hit_rate(tiny_llama_dir)
    print(
        f"prefix hit rate: 2 replicas {hits / queries:.3f} ({hits:.0f}/{queries:.0f}), one engine {single:.3f}"
    )
    assert single > 0.5 and hits / queries >= 0.9 * single


def test_streaming_and_client_disconnect_abort_through_the_ingress(cluster):
    body = {"prompt": "Once upon a time", "max_tokens": 20, "stream": True}
    with httpx.stream(
        "POST", f"{cluster.base_url}/v1/completions", json=body, timeout=60
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2
    assert json.loads(events[0][6:])["object"] == "text_completion"

    long = {**body, "max_tokens": 8000, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{cluster.base_url}/v1/completions", json=long, timeout=60
    ) as response:
        replica = cluster.replica_url(response.headers["x-spyglass-replica"])
        lines = response.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        assert httpx.get(f"{replica}/debug/kv").json()["num_requests"] == 1
    # The client hung up mid-stream: the replica's engine aborts the request and its blocks come back.
    deadline = time.monotonic() + 30
    while (kv := httpx.get(f"{replica}/debug/kv").json())[
        "num_requests"
    ] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kv["num_requests"] == 0 and kv["num_free_blocks"] == kv["num_blocks"]


def test_the_trace_continues_from_the_ingress_into_the_replica(cluster):
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"traceparent": f"00-{trace_id}-{client_span}-01"}
    body = {"messages": [{"role": "user", "content": "trace me"}], "max_tokens": 2}
    response = httpx.post(
        f"{cluster.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    assert response.status_code == 200

    def spans():
        return [s for s in _OtlpReceiver.spans if s.trace_id.hex() == trace_id]

    def chain():
        """(ingress, replica, engine spans) once all three processes have exported, else None."""
        by_parent = defaultdict(list)
        for span in spans():
            by_parent[span.parent_span_id.hex()].append(span)
        ingresses = by_parent[client_span]  # the ingress's SERVER span, child of the client's
        replicas = [r for i in ingresses for r in by_parent[i.span_id.hex()]]
        engine = [e for r in replicas for e in by_parent[r.span_id.hex()]]
        if not any(e.name.startswith("chat") for e in engine):
            return None
        return ingresses, replicas, engine

    # Each process exports on its own batch schedule: wait for the whole chain, not its first part.
    deadline = time.monotonic() + 60
    while (found := chain()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert found is not None, [(s.name, s.parent_span_id.hex()) for s in spans()]
    ingresses, replicas, _ = found
    (ingress,), (replica,) = ingresses, replicas
    assert ingress.name == replica.name == "POST /v1/chat/completions"


def test_a_responses_conversation_stays_with_the_replica_that_keeps_it(cluster):
    """Each turn continues the last through the ingress: every call, and the stored-response
    routes, reach the one replica that keeps it (by chance, 4 turns on 2 replicas would all land
    there one time in 16); the ingress counts them by that reason. The same for a conversation's
    turns."""
    openai = pytest.importorskip("openai")

    def kept_routes() -> float:
        text = httpx.get(f"{cluster.base_url}/metrics").text
        families = text_string_to_metric_families(text)
        return sum(
            s.value
            for f in families
            for s in f.samples
            if s.name == "spyglass:replica_routes_total" and s.labels["reason"] == "kept_response"
        )

    client = openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="unused", timeout=120)
    greedy = dict(model="tiny", max_output_tokens=3, temperature=0)
    before = kept_routes()
    raw = client.responses.with_raw_response.create(input="Name a colour.", **greedy)
    keeper = raw.headers["x-spyglass-replica-id"]
    turns = [raw.parse()]
    assert turns[0].id.startswith(f"resp_{safe_tag(keeper)}_")
    for turn in range(4):
        raw = client.responses.with_raw_response.create(
            input=f"And another, number {turn}?", previous_response_id=turns[-1].id, **greedy
        )
        assert raw.headers["x-spyglass-replica-id"] == keeper
        turns.append(raw.parse())
    last = turns[-1]
    assert client.responses.retrieve(last.id).output_text == last.output_text
    items = client.responses.input_items.list(last.id, order="asc", limit=100).data
    assert len(items) == 2 * len(turns) - 1  # each turn's question, each earlier answer
    client.responses.delete(last.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(last.id)
    assert kept_routes() - before >= 4 + 3  # the continuations, then retrieve, list, delete
    # A conversation: kept by the replica that made it, which answers every call in it.
    made = client.conversations.with_raw_response.create()
    keeper, conversation = made.headers["x-spyglass-replica-id"], made.parse()
    for turn in range(4):
        raw = client.responses.with_raw_response.create(
            input=f"Turn {turn}.", conversation=conversation.id, **greedy
        )
        assert raw.headers["x-spyglass-replica-id"] == keeper
    assert len(client.conversations.items.list(conversation.id, limit=100).data) == 8


def test_ingress_metrics_are_labelled_ingress(cluster):
    text = httpx.get(f"{cluster.base_url}/metrics").text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert any(s.name == "spyglass:http_requests_total" for s in samples)
    assert all(s.labels.get("replica") == "ingress" for s in samples)


def test_a_killed_replica_is_replaced_while_the_other_serves(cluster):
    body = {
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPTS[0]},
            {"role": "user", "content": "hi"},
        ],
        "max_tokens": 2,
    }
    with httpx.Client(base_url=cluster.base_url, timeout=120) as client:
        first = client.post("/v1/chat/completions", json=body)
        victim_rank, victim_id = (
            first.headers["x-spyglass-replica"],
            first.headers["x-spyglass-replica-id"],
        )
        (name,) = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].endswith("#" + victim_id)
        ]
        ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
        killed_at = time.monotonic()
        # The other replica serves the same prefix at once; no request fails.
        for _ in range(4):
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            assert response.headers["x-spyglass-replica"] != victim_rank
        # Ray starts a replacement, which takes the dead one's rank (and so its port and label).
        while time.monotonic() - killed_at < 180:
            states = serve.status().applications[APP].deployments["EngineReplica"].replica_states
            actors = ray.util.list_named_actors(all_namespaces=True)
            names = [a["name"] for a in actors if "#EngineReplica#" in a["name"]]
            if (
                states == {"RUNNING": 2}
                and len(names) == 2
                and not any(victim_id in n for n in names)
            ):
                break
            time.sleep(1)
        assert states == {"RUNNING": 2} and not any(victim_id in n for n in names)
        # The replacement's actor is named, and the controller may still count the dead replica
        # as running, before the replacement's constructor has started its server: wait for it.
        while True:
            try:
                health = httpx.get(f"{cluster.replica_url(victim_rank)}/health", timeout=10)
                break
            except httpx.ConnectError:
                assert time.monotonic() - killed_at < 180, "the replacement never listened"
                time.sleep(1)
        print(f"replica replaced in {time.monotonic() - killed_at:.1f} s")
        assert health.status_code == 200
