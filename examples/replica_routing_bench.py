"""Prefix-cache hit rate of one engine, of 2 replicas behind the prefix-affinity router, and of 2 behind Ray's default.

    python examples/replica_routing_bench.py [--model PATH] [--prompts 4] [--questions 6]

Starts a local Ray cluster, sends the same chat requests (``--prompts`` long system prompts, each with
``--questions`` user questions, interleaved) through each setup, and prints the prompt tokens found
in the prefix caches over those looked up, read from the engines' ``/metrics``. The figures in
docs/scaling.md come from this script.
"""

import argparse
import socket
from collections import Counter, defaultdict

import httpx
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray import serve
from ray.serve.config import RequestRouterConfig

from spyglass.core.api.server_options import ServerOptions
from spyglass.core.engine.config import EngineConfig
from spyglass.core.replicas import deployments
from spyglass.telemetry.settings import TelemetrySettings

TOPICS = [
    "railway timetables",
    "elementary geometry",
    "sourdough baking",
    "tax returns",
    "chess openings",
    "houseplants",
    "bicycle repair",
    "astronomy",
]


def requests(num_prompts: int, num_questions: int) -> list[dict]:
    systems = [
        f"You are an expert on {topic}. Answer precisely, cite the rule you rely on, say when you are "
        f"unsure, and end with a one-line summary. Never answer outside {topic}. " * 4
        for topic in TOPICS
    ]
    return [
        {
            "messages": [
                {"role": "system", "content": systems[p]},
                {"role": "user", "content": f"Question {q}?"},
            ],
            "max_tokens": 2,
            "temperature": 0,
        }
        for q in range(num_questions)
        for p in range(num_prompts)
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hit_rate(metrics_urls: list[str], send) -> tuple[float, dict]:
    def counts():
        total = defaultdict(float)
        for url in metrics_urls:
            for family in text_string_to_metric_families(httpx.get(url).text):
                for sample in family.samples:
                    total[sample.name] += sample.value
        return total["spyglass:prefix_cache_hits_total"], total[
            "spyglass:prefix_cache_queries_total"
        ]

    (hits0, queries0), served_by = counts(), send()
    hits, queries = counts()
    return (hits - hits0) / (queries - queries0), served_by


def run(
    engine: EngineConfig, bodies: list[dict], port: int, replicas: int, router
) -> tuple[float, dict]:
    replica_port = _free_port()
    app = deployments.build_application(
        engine,
        ServerOptions(port=port),
        TelemetrySettings(tracing=False),
        replicas,
        replica_port,
        request_router=router,
    )
    serve.run(app, name="bench", route_prefix="/")

    def send():
        served_by = defaultdict(set)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            for body in bodies:
                response = client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                served_by[body["messages"][0]["content"][:40]].add(
                    response.headers["x-spyglass-replica"]
                )
        return dict(served_by)

    try:
        return hit_rate(
            [f"http://127.0.0.1:{replica_port + i}/metrics" for i in range(replicas)], send
        )
    finally:
        serve.delete("bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--questions", type=int, default=6)
    args = parser.parse_args()
    engine = EngineConfig(model=args.model, num_threads=1, kv_cache_memory=256 << 20)
    bodies = requests(args.prompts, args.questions)
    ray.init(include_dashboard=False, log_to_driver=False)
    port = _free_port()
    serve.start(
        http_options={"host": "127.0.0.1", "port": port}
    )  # once: Serve keeps its first HTTP options
    try:
        for name, replicas, router in [
            ("one engine", 1, None),
            ("2 replicas, prefix-affinity router", 2, None),
            ("2 replicas, Ray's default router (power of two choices)", 2, RequestRouterConfig()),
        ]:
            rate, served_by = run(engine, bodies, port, replicas, router)
            spread = sorted(len(ranks) for ranks in served_by.values())
            homes = sorted(
                Counter(
                    rank for ranks in served_by.values() if len(ranks) == 1 for rank in ranks
                ).items()
            )
            print(
                f"{name}: prefix hit rate {rate:.3f}; replicas per system prompt {spread}; "
                f"system prompts served by one replica only, per replica {homes}",
                flush=True,
            )
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
