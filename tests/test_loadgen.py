"""The load generator: exact prompt lengths, honest statistics, every request accounted for."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Mapping
from typing import Any

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from laneway.bench.harness.loadgen import LoadGenerator, RequestRecord
from laneway.bench.harness.procs import Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.summary import summarize
from laneway.bench.harness.workload import (
    INTERACTIVE,
    LONG,
    LongRequest,
    Workload,
    draw_turn,
    session_rng,
    workload_from_scenario,
)
from laneway.simulator.seed import SeedScenario
from laneway.stats import percentile
from laneway.tokens import ChatMessage, count_chat, default_tokenizer

# -- pure parts ---------------------------------------------------------------------------


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 100.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order of input does not matter


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], -1), ([1.0], 101)])
def test_percentile_refuses_what_has_no_answer(values: list[float], q: float) -> None:
    with pytest.raises(ValueError, match=r"percentile|q must"):
        percentile(values, q)


def test_turns_stay_in_their_ranges_and_each_session_is_reproducible() -> None:
    workload = Workload(model="m", prompt_tokens=(10, 20), output_tokens=(3, 4), think_s=(0.5, 1))
    turns = [draw_turn(session_rng(1, 0), workload) for _ in range(3)]
    assert turns[0] == turns[1] == turns[2]  # same seed and session, same first turn
    rng = session_rng(1, 0)
    for turn in (draw_turn(rng, workload) for _ in range(200)):
        assert 10 <= turn.prompt_tokens <= 20
        assert 3 <= turn.output_tokens <= 4
        assert 0.5 <= turn.think_s <= 1
    first_of_each = {draw_turn(session_rng(1, s), workload) for s in range(20)}
    assert len(first_of_each) > 1  # sessions draw from their own streams


def test_the_seed_scenario_becomes_a_workload_drawn_like_the_virtual_runner() -> None:
    scenario = SeedScenario(sessions=3, long_requests=2, seed=5)
    workload = workload_from_scenario(scenario, "m")
    assert (workload.sessions, workload.duration_s, workload.seed) == (3, 60.0, 5)
    assert workload.think_s == scenario.think_time_s
    assert workload.ramp_s == scenario.session_start_spread_s
    assert workload.long_requests == (LongRequest(5.0, 65536, 512),) * 2
    # The virtual runner's order of draws on "{seed}/session/{index}": start offset, then
    # per turn prompt, output, think.
    runner_rng = random.Random("5/session/1")
    start = runner_rng.uniform(0, scenario.session_start_spread_s)
    expected = [
        (runner_rng.randint(200, 1500), runner_rng.randint(50, 250), runner_rng.uniform(1.0, 5.0))
        for _ in range(4)
    ]
    rng = session_rng(5, 1)
    assert rng.uniform(0, workload.ramp_s) == start
    drawn = [draw_turn(rng, workload) for _ in range(4)]
    assert [(t.prompt_tokens, t.output_tokens, t.think_s) for t in drawn] == expected


@pytest.mark.parametrize(
    "changes",
    [
        {"prompt_tokens": (10, 5)},
        {"output_tokens": (0, 5)},
        {"think_s": (-1.0, 1.0)},
        {"sessions": -1},
        {"max_requests": -2},
        {"long_requests": (LongRequest(at_s=-1, prompt_tokens=10, output_tokens=1),)},
    ],
)
def test_a_workload_that_cannot_run_is_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"must|needs"):
        Workload(model="m", **changes)


@pytest.mark.parametrize("tokens", [1, 2, 17, 1000, 65536])
def test_prompts_have_exactly_the_asked_token_count(tokens: int) -> None:
    tokenizer = default_tokenizer()
    factory = PromptFactory(tokenizer)
    assert tokenizer.count(factory.text(random.Random(tokens), tokens)) == tokens


@pytest.mark.parametrize("prompt_tokens", [200, 777, 1500])
def test_chat_prompts_count_as_asked_with_the_chat_framing(prompt_tokens: int) -> None:
    tokenizer = default_tokenizer()
    factory = PromptFactory(tokenizer)
    content = factory.chat_content(random.Random(0), prompt_tokens)
    counted = count_chat(tokenizer, [ChatMessage("user", content)])
    assert counted == prompt_tokens == factory.chat_prompt_tokens(prompt_tokens)


def record(
    kind: str = INTERACTIVE,
    lane: str | None = "interactive",
    pool: str | None = "rt",
    status: int = 200,
    ttft: float | None = 0.1,
    gaps: tuple[float, ...] = (0.01, 0.02),
    error: str | None = None,
) -> RequestRecord:
    return RequestRecord(
        kind=kind,
        session=0,
        started_s=0.0,
        prompt_tokens=100,
        max_tokens=3,
        status=status,
        lane=lane,
        pool=pool,
        routed_prompt_tokens=100,
        output_tokens=len(gaps) + 1 if ttft is not None else 0,
        ttft_s=ttft,
        gaps_s=gaps,
        e2e_s=None if status == 0 else 1.0,
        error=error,
    )


def test_summaries_group_by_lane_and_count_pools_and_errors() -> None:
    records = [
        record(pool="rt-a", ttft=0.1, gaps=(0.01,)),
        record(pool="rt-b", ttft=0.3, gaps=(0.03, 0.05)),
        record(pool="rt-a", status=429, ttft=None, gaps=(), error="queue full"),
        record(kind=LONG, lane="batch", pool="batch-a", ttft=2.0, gaps=(0.02,)),
        # Straight from an engine there is no lane header: the kind says where it belongs.
        record(kind=LONG, lane=None, pool=None, status=0, ttft=None, gaps=(), error="cut off"),
    ]
    interactive, batch = summarize(records)
    assert (interactive.lane, interactive.requests, interactive.ok, interactive.failed) == (
        "interactive",
        3,
        2,
        1,
    )
    assert interactive.ttft is not None
    assert (interactive.ttft.count, interactive.ttft.max) == (2, 0.3)
    assert (interactive.ttft.p50, interactive.ttft.p99) == pytest.approx((0.2, 0.298))
    assert interactive.tbt is not None
    assert interactive.tbt.count == 3
    assert interactive.tbt.max == 0.05
    assert dict(interactive.pools) == {"rt-a": 2, "rt-b": 1}
    assert interactive.errors == (("429: queue full", 1),)
    assert (batch.lane, batch.requests, batch.ok) == ("batch", 2, 1)
    assert dict(batch.pools) == {"batch-a": 1}  # a request that got no response went nowhere
    assert batch.errors == (("cut off", 1),)
    assert summarize([]) == ()


# -- against a streaming server over loopback ---------------------------------------------

LONG_FROM = 10_000  # the fake gateway's lane boundary


def fake_gateway(token_delay: float = 0.002, stall_long: bool = False) -> web.Application:
    """Streams max_tokens tokens like an OpenAI server, with laneway's routing headers.

    It counts each prompt with the shared tokenizer and routes by that count. Test headers
    make it refuse a request (x-test-reject) or end a stream with an error (x-test-break).
    """
    tokenizer = default_tokenizer()

    async def handle(request: web.Request) -> web.StreamResponse:
        body: Mapping[str, Any] = await request.json()
        if "messages" in body:
            messages = [ChatMessage(m["role"], m["content"]) for m in body["messages"]]
            tokens = count_chat(tokenizer, messages)
        else:
            tokens = tokenizer.count(body["prompt"])
        lane = "batch" if tokens >= LONG_FROM else "interactive"
        if request.headers.get("x-test-reject"):
            return web.json_response(
                {"error": {"message": "pool saturated", "type": "rate_limit", "code": 429}},
                status=429,
            )
        response = web.StreamResponse(
            headers={
                "content-type": "text/event-stream",
                "x-laneway-lane": lane,
                "x-laneway-pool": f"{lane}-pool",
                "x-laneway-prompt-tokens": str(tokens),
            }
        )
        await response.prepare(request)
        if lane == "batch" and stall_long:
            await asyncio.sleep(3600)
        for index in range(int(body["max_tokens"])):
            await asyncio.sleep(token_delay)
            choice = (
                {"index": 0, "delta": {"content": f" t{index}"}}
                if "messages" in body
                else {"index": 0, "text": f" t{index}"}
            )
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        if request.headers.get("x-test-break"):
            await response.write(b'data: {"error": {"message": "upstream died"}}\n\n')
        else:
            await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    return app


def small_workload(**changes: Any) -> Workload:
    settings: dict[str, Any] = {
        "model": "m",
        "sessions": 4,
        "prompt_tokens": (200, 1500),
        "output_tokens": (3, 8),
        "think_s": (0.02, 0.05),
        "ramp_s": 0.05,
        "duration_s": 0.6,
        "long_requests": (
            LongRequest(at_s=0.1, prompt_tokens=20_000, output_tokens=4),
            LongRequest(at_s=0.2, prompt_tokens=12_000, output_tokens=4),
        ),
        "drain_s": 30.0,
        "seed": 3,
    }
    return Workload(**{**settings, **changes})


async def test_every_request_is_accounted_for_and_lands_in_its_lane(
    aiohttp_server: AiohttpServer,
) -> None:
    server = await aiohttp_server(fake_gateway())
    workload = small_workload()
    generator = LoadGenerator(workload, str(server.make_url("/")))
    records = await generator.run()

    assert len(records) == generator.issued > workload.sessions
    assert sum(generator.in_flight.values()) == 0
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    interactive = [r for r in records if r.kind == INTERACTIVE]
    long = [r for r in records if r.kind == LONG]
    assert len(long) == 2
    assert {r.session for r in interactive} == set(range(workload.sessions))
    for r in records:
        # The server counted what the generator meant to send, token for token.
        assert r.routed_prompt_tokens == r.prompt_tokens
        assert r.lane == ("batch" if r.kind == LONG else "interactive")
        assert r.pool == f"{r.lane}-pool"
        assert r.output_tokens == r.max_tokens
        assert len(r.gaps_s) == r.output_tokens - 1
        assert r.ttft_s is not None
        assert r.e2e_s is not None
        assert r.e2e_s >= r.ttft_s
    for spec in workload.long_requests:
        assert any(r.prompt_tokens == spec.prompt_tokens and r.started_s >= spec.at_s for r in long)


async def test_the_same_seed_sends_each_session_the_same_turns(
    aiohttp_server: AiohttpServer,
) -> None:
    """Each session draws its turns from its own seeded stream; which sessions get in under a
    cap shared across sessions is timing, so what repeats is every session's sequence."""
    server = await aiohttp_server(fake_gateway())
    url = str(server.make_url("/"))

    async def turns_by_session(seed: int) -> list[list[tuple[int, int]]]:
        workload = small_workload(max_requests=6, duration_s=30.0, long_requests=(), seed=seed)
        records = await LoadGenerator(workload, url).run()
        assert len(records) == 6  # max_requests bounds the run long before its duration
        return [
            [(r.prompt_tokens, r.max_tokens) for r in records if r.session == session]
            for session in range(workload.sessions)
        ]

    first, second, other_seed = [await turns_by_session(seed) for seed in (3, 3, 4)]
    for one, two in zip(first, second, strict=True):
        shorter, longer = sorted((one, two), key=len)
        assert shorter == longer[: len(shorter)]
    assert [turns[:1] for turns in first if turns] != [turns[:1] for turns in other_seed if turns]


async def test_time_limit_cuts_off_what_is_still_running_and_records_it(
    aiohttp_server: AiohttpServer,
) -> None:
    server = await aiohttp_server(fake_gateway(stall_long=True))
    workload = small_workload(duration_s=0.3, drain_s=0.5)
    generator = LoadGenerator(workload, str(server.make_url("/")))
    records = await generator.run()
    assert len(records) == generator.issued
    cut = [r for r in records if r.kind == LONG]
    assert len(cut) == 2
    assert all(r.status == 0 and r.error == "cut off at the time limit" for r in cut)
    assert all(r.ok for r in records if r.kind == INTERACTIVE)


async def test_refusals_and_broken_streams_are_recorded_with_their_reasons(
    aiohttp_server: AiohttpServer,
) -> None:
    server = await aiohttp_server(fake_gateway())
    url = str(server.make_url("/"))
    refused = await LoadGenerator(
        small_workload(headers={"x-test-reject": "1"}, max_requests=3), url
    ).run()
    assert {(r.status, r.error) for r in refused} == {(429, "pool saturated")}
    assert len(refused) == 3 + 2  # three turns and both long requests
    broken = await LoadGenerator(
        small_workload(headers={"x-test-break": "1"}, max_requests=2, long_requests=()), url
    ).run()
    assert len(broken) == 2
    assert all(r.status == 200 and r.error == "upstream died" and not r.ok for r in broken)
    assert all(r.output_tokens == r.max_tokens for r in broken)


async def test_an_unreachable_server_is_recorded_not_raised(
    unused_tcp_port: int,
) -> None:
    workload = small_workload(max_requests=2, long_requests=())
    generator = LoadGenerator(workload, f"http://127.0.0.1:{unused_tcp_port}")
    records = await generator.run()
    assert len(records) == 2
    assert all(r.status == 0 and r.error and "Connect" in r.error for r in records)


async def test_against_a_real_simulated_engine_every_token_is_timed() -> None:
    async with Children() as children:
        engine = await children.start_laneway_async(
            "sim",
            ["--port", "0", "--model", "m", "--max-context", "32768", "--time-scale", "20"],
        )
        workload = small_workload(
            sessions=3,
            output_tokens=(5, 20),
            think_s=(0.1, 0.5),
            ramp_s=0.5,
            duration_s=3.0,
            long_requests=(LongRequest(at_s=0.5, prompt_tokens=20_000, output_tokens=8),),
        )
        generator = LoadGenerator(workload, engine.url, time_scale=20)
        records = await generator.run()
    assert len(records) == generator.issued
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert sum(r.kind == LONG for r in records) == 1
    for r in records:
        assert r.lane is None  # straight from an engine: no routing headers
        assert r.output_tokens == r.max_tokens
        assert len(r.gaps_s) == r.max_tokens - 1
    lanes = [s.lane for s in summarize(records)]
    assert lanes == ["interactive", "batch"]
