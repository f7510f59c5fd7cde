"""The sending half of ``spyglass bench serve``: each request streamed from ``/v1/completions``
and timed (first token, each token after, end to end), or sent whole and timed end to end
(``--no-stream``), the workload sent all at once or at a Poisson rate, or by a fixed number of
clients back to back."""

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from spyglass.core.cli.bench.workloads import BenchRequest


@dataclass(slots=True)
class RequestResult:
    """What one streamed request measured; times in seconds."""

    ok: bool
    prompt_len: int
    output_len: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str = ""


async def _send(
    client: httpx.AsyncClient, request: BenchRequest, model: str | None, stream: bool
) -> RequestResult:
    body = {
        "prompt": request.prompt_token_ids,
        "max_tokens": request.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if model:
        body["model"] = model
    result = RequestResult(ok=False, prompt_len=len(request.prompt_token_ids))
    start = last = time.perf_counter()
    if not stream:
        return await _send_whole(client, body, result, start)
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.output_len = chunk["usage"]["completion_tokens"]
                if chunk.get("choices"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
        result.e2e = time.perf_counter() - start
        result.ok = True
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def _send_whole(
    client: httpx.AsyncClient, body: dict, result: RequestResult, start: float
) -> RequestResult:
    """A non-streamed call: its answer at once, timed end to end."""
    try:
        response = await client.post("/v1/completions", json=body)
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {response.content[:200]!r}"
            return result
        result.output_len = response.json()["usage"]["completion_tokens"]
        result.e2e = time.perf_counter() - start
        result.ok = True
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def run_load(args, workload: list[BenchRequest]) -> tuple[list[RequestResult], float, float]:
    """Send ``workload`` as ``args`` say; the results, and when sending began and the last answer
    ended (monotonic seconds)."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(
        base_url=args.base_url, headers=headers, timeout=None, limits=limits
    ) as client:
        start = time.monotonic()
        if args.concurrency:
            results = await _closed_loop(
                client, workload, args.concurrency, args.model, args.stream
            )
        else:
            results = await _open_loop(
                client, workload, args.rate, args.seed, args.model, args.stream
            )
        return results, start, time.monotonic()


async def _closed_loop(client, workload, concurrency: int, model, stream) -> list[RequestResult]:
    queue = list(reversed(workload))
    results: list[RequestResult] = []

    async def worker() -> None:
        while queue:
            results.append(await _send(client, queue.pop(), model, stream))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


async def _open_loop(
    client, workload, rate: float, seed: int, model, stream
) -> list[RequestResult]:
    rng = np.random.default_rng(seed)
    tasks = []
    for request in workload:
        tasks.append(asyncio.create_task(_send(client, request, model, stream)))
        if math.isfinite(rate):
            await asyncio.sleep(rng.exponential(1.0 / rate))
    return list(await asyncio.gather(*tasks))
