"""``spyglass bench soak``: many requests against a running server, a share of them abandoned mid-flight.

Half the requests stream and half do not; a ``--disconnect-share`` of them hang up early (a
stream after its first chunk, a non-streamed call after a random delay). At the end it reports
what completed, what was aborted, errors by status, the KV blocks still in use once the server
is idle (leaks), and the server's resident memory at start and end (from ``/metrics``).
"""

import asyncio
import json
import logging
import os
import random
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

_RSS = re.compile(r"^process_resident_memory_bytes (\S+)$", re.MULTILINE)
WORDS = [
    "the",
    "a",
    "sea",
    "cat",
    "ship",
    "light",
    "river",
    "stone",
    "bright",
    "slow",
    "early",
    "window",
    "over",
    "under",
    "and",
    "of",
]


@dataclass(slots=True)
class SoakReport:
    """The outcome of one soak run; ``lost`` counts requests neither completed nor deliberately abandoned."""

    num_requests: int
    completed: int = 0
    aborted: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    kv_blocks_in_use: int | None = None
    rss_start_mib: float | None = None
    rss_end_mib: float | None = None
    duration_s: float = 0.0

    @property
    def lost(self) -> int:
        """Requests that ended in an error."""
        return sum(self.errors.values())


def add_parser(subparsers, argv) -> None:
    """Register ``bench soak``."""
    parser = subparsers.add_parser(
        "soak", help="requests with random client disconnects against a running server"
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument(
        "--disconnect-share", type=float, default=0.2, help="share of requests that hang up early"
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default=os.environ.get("SPYGLASS_API_KEY"))
    parser.add_argument(
        "--json", dest="json_path", default=None, help="also write the report to this JSON file"
    )
    parser.set_defaults(run=run)


async def _one(
    client: httpx.AsyncClient, rng: random.Random, max_tokens: int, disconnect: bool
) -> str:
    """Send one request; its outcome: "completed", "aborted", or an error label."""
    stream = rng.random() < 0.5
    body = {
        "prompt": " ".join(rng.choices(WORDS, k=rng.randint(3, 40))),
        "max_tokens": rng.randint(1, max_tokens),
        "temperature": rng.choice([0.0, 0.8]),
        "ignore_eos": True,
        "stream": stream,
    }
    if not stream:
        call = asyncio.ensure_future(client.post("/v1/completions", json=body))
        if disconnect:
            await asyncio.sleep(rng.uniform(0.0, 0.5))
            if not call.done():
                call.cancel()  # closes the connection: the server must abort the request
                return "aborted"
        response = await call
        return "completed" if response.status_code == 200 else f"HTTP {response.status_code}"
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            return f"HTTP {response.status_code}"
        async for line in response.aiter_lines():
            if line.startswith('data: {"error"'):
                return "stream error"
            if disconnect and line.startswith("data: "):
                return "aborted"  # leaving the block closes the stream after its first chunk
            if line == "data: [DONE]":
                return "completed"
    return "stream cut"


async def _server_state(client: httpx.AsyncClient) -> tuple[dict, float | None]:
    kv = (await client.get("/debug/kv")).json()
    match = _RSS.search((await client.get("/metrics")).text)
    return kv, float(match.group(1)) / 2**20 if match else None


async def soak(
    base_url: str,
    num_requests: int,
    disconnect_share: float,
    concurrency: int,
    max_tokens: int,
    seed: int = 0,
    api_key: str | None = None,
) -> SoakReport:
    """Run the soak and wait (up to 30 s) for the server to go idle before reading its KV and memory."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rng = random.Random(seed)
    plan = [rng.random() < disconnect_share for _ in range(num_requests)]
    report = SoakReport(num_requests)
    outcomes: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300) as client:
        _, report.rss_start_mib = await _server_state(client)
        start = time.perf_counter()

        async def worker() -> None:
            while plan:
                disconnect = plan.pop()
                try:
                    outcomes[await _one(client, rng, max_tokens, disconnect)] += 1
                except httpx.HTTPError as error:
                    outcomes[type(error).__name__] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        report.duration_s = time.perf_counter() - start
        deadline = time.monotonic() + 30
        kv, report.rss_end_mib = await _server_state(client)
        while kv["num_requests"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            kv, report.rss_end_mib = await _server_state(client)
        report.kv_blocks_in_use = kv["num_blocks"] - kv["num_free_blocks"]
    report.completed = outcomes.pop("completed", 0)
    report.aborted = outcomes.pop("aborted", 0)
    report.errors = dict(outcomes)
    return report


def run(args) -> int:
    """Run the soak, print the report; exit 1 if any request was lost or any KV block leaked."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    report = asyncio.run(
        soak(
            args.base_url,
            args.num_requests,
            args.disconnect_share,
            args.concurrency,
            args.max_tokens,
            args.seed,
            args.api_key,
        )
    )
    rss = (
        f"{report.rss_start_mib:.0f} -> {report.rss_end_mib:.0f} MiB"
        if report.rss_start_mib
        else "unknown"
    )
    print(
        f"{report.num_requests} requests in {report.duration_s:.1f} s: {report.completed} completed, "
        f"{report.aborted} aborted by the client, {report.lost} lost {report.errors or ''}"
    )
    print(f"KV blocks in use when idle: {report.kv_blocks_in_use}; server RSS {rss}")
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump({**asdict(report), "lost": report.lost}, out, indent=2)
    return 0 if report.lost == 0 and report.kv_blocks_in_use == 0 else 1
