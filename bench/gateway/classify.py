"""The gateway's routing of a long prompt, timed in this process: bounds-decided and exactly
counted; and how long the event loop stalls while the exact count runs off it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

from laneway.api import InferencePool, parse_pool
from laneway.bench.gateway.config import MODEL, BenchOptions, pool_documents
from laneway.bench.gateway.results import ClassifyResult, LoopStall
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.summary import Distribution
from laneway.stats import percentile
from laneway.tokens import TokenBounds, default_tokenizer


async def time_classification(options: BenchOptions, clock: Callable[[], float]) -> ClassifyResult:
    """Time the gateway's routing path for one long prompt, bounds-decided and exact.

    The path is the gateway's own `settle_route` (bounds first, the exact count where they
    do not decide); the count runs inline here, where the gateway runs it off its loop.
    """
    from laneway.gateway.serving.request_body import Endpoint, parse_request
    from laneway.gateway.serving.routing import settle_route
    from laneway.routing.lanes import Route, RouteRequest

    tokenizer = default_tokenizer()
    body = long_prompt_body(options)
    # The byte bound of this prompt is several times its token count: a batch pool whose
    # context covers the byte bound is decided by bounds, one capped just above the token
    # count needs the exact count.
    roomy = [parse_pool(d) for d in pool_documents("http://127.0.0.1:1", 2 * len(body))]
    tight = [
        parse_pool(d) for d in pool_documents("http://127.0.0.1:1", options.classify_tokens + 2048)
    ]

    async def route(pools: Sequence[InferencePool]) -> tuple[str, dict[str, float]]:
        stages = dict.fromkeys(STAGES, 0.0)
        begun = clock()
        parsed = parse_request(body, Endpoint.COMPLETIONS)
        parsed_at = clock()
        bounds = parsed.bounds(tokenizer)
        bounded_at = clock()

        ask = RouteRequest(model=parsed.model, prompt_tokens=bounds, max_tokens=parsed.max_tokens)

        async def count_exactly() -> RouteRequest:
            counting = clock()
            exact = parsed.count(tokenizer)
            stages["count"] = clock() - counting
            return dataclasses.replace(ask, prompt_tokens=TokenBounds(low=exact, high=exact))

        decision = await settle_route(ask, pools, count_exactly)
        stages["classify"] = clock() - bounded_at - stages["count"]
        stages["parse"] = parsed_at - begun
        stages["bounds"] = bounded_at - parsed_at
        if not isinstance(decision, Route):
            raise RuntimeError(f"the benchmark prompt was not routed: {decision}")
        return decision.pool.name, stages

    bounds_runs = [await route(roomy) for _ in range(options.classify_repeats)]
    exact_runs = [await route(tight) for _ in range(options.classify_repeats)]
    return ClassifyResult(
        prompt_tokens=options.classify_tokens,
        prompt_bytes=len(body),
        repeats=options.classify_repeats,
        bounds_decided_s=_total(bounds_runs),
        exact_count_s=_total(exact_runs),
        bounds_pool=bounds_runs[0][0],
        exact_pool=exact_runs[0][0],
        bounds_stages_s=_stage_medians(bounds_runs),
        exact_stages_s=_stage_medians(exact_runs),
    )


def long_prompt_body(options: BenchOptions) -> bytes:
    text = PromptFactory(default_tokenizer()).text(
        random.Random(options.seed), options.classify_tokens
    )
    return json.dumps({"model": MODEL, "prompt": text, "max_tokens": 64}).encode()


async def count_stalls(options: BenchOptions) -> tuple[LoopStall, ...]:
    """The event loop's longest stall during an exact count of the long prompt: in the
    gateway's worker process (started and warmed first), in a thread of the default
    executor as the gateway counted before, and with the loop alone for as long."""
    from laneway.gateway.serving.counting import OffLoopCounter
    from laneway.gateway.serving.request_body import Endpoint, parse_request

    tokenizer = default_tokenizer()
    parsed = parse_request(long_prompt_body(options), Endpoint.COMPLETIONS)
    loop = asyncio.get_running_loop()
    counter = OffLoopCounter()
    stalls: dict[str, list[float]] = {"a worker process": [], "a thread": [], "nothing": []}
    try:
        await counter.count(parsed, tokenizer)
        for _ in range(options.classify_repeats):
            begun = time.perf_counter()
            stalls["a worker process"].append(
                await loop_stall_while(counter.count(parsed, tokenizer))
            )
            took = time.perf_counter() - begun
            stalls["a thread"].append(
                await loop_stall_while(loop.run_in_executor(None, parsed.count, tokenizer))
            )
            stalls["nothing"].append(await loop_stall_while(asyncio.sleep(took)))
    finally:
        counter.close()
    return tuple(
        LoopStall(where=where, p50_s=statistics.median(gaps), max_s=max(gaps))
        for where, gaps in stalls.items()
    )


async def loop_stall_while(work: Awaitable[object], tick_s: float = 0.001) -> float:
    """Run `work` as a task; the longest gap between the loop's 1 ms ticks meanwhile."""
    running = asyncio.ensure_future(work)
    longest, last = 0.0, time.perf_counter()
    while not running.done():
        await asyncio.sleep(tick_s)
        now = time.perf_counter()
        longest, last = max(longest, now - last - tick_s), now
    await running
    return max(longest, 0.0)


STAGES = ("parse", "bounds", "count", "classify")


def _total(runs: Sequence[tuple[str, dict[str, float]]]) -> Distribution:
    totals = Distribution.of([sum(stages.values()) for _, stages in runs])
    assert totals is not None  # at least one repeat
    return totals


def _stage_medians(runs: Sequence[tuple[str, dict[str, float]]]) -> tuple[tuple[str, float], ...]:
    return tuple((stage, percentile([s[stage] for _, s in runs], 50)) for stage in STAGES)
