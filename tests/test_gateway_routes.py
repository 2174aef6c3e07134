"""One gateway with an interactive and a batch lane, in-process: two simulated engines and
the gateway app on loopback, the official openai client, for the routing and error tests.

The module shares one setup, as a deployment would serve these requests one after another;
the gateway's own process (its flags, drain and faults) is tested in test_gateway_e2e.py.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from support.client import client, eventually, scrape, total
from support.inproc import Served, Servers
from support.pools import FAST, MAX_BODY, gateway_doc, pool_doc

from laneway.routing.slo import PRIOR_MS_PER_TOKEN
from laneway.tokens import default_tokenizer

# The engines and the gateway serve in the module's event loop, which every test shares.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lanes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    servers = Servers()
    realtime = await servers.sim("llama-small", "--time-scale", FAST, "--max-context", "4096")
    batch = await servers.sim(
        "llama-long",
        *("--time-scale", FAST, "--scheduler", "chunked", "--max-context", "131072"),
        *("--metrics-flavor", "sglang"),
    )
    documents = [
        pool_doc(
            "realtime",
            "interactive",
            "llama-small",
            [realtime.url],
            routing={"maxPromptTokens": 2000},
            limits={"maxContextTokens": 4096},
        ),
        pool_doc(
            "batch",
            "batch",
            "llama-long",
            [batch.url],
            routing={"minPromptTokens": 2001},
            limits={"maxContextTokens": 131072},
        ),
        gateway_doc(),
    ]
    path = tmp_path_factory.mktemp("lanes") / "gateway.yaml"
    yield await servers.gateway(path, documents)
    await servers.close()


@pytest_asyncio.fixture(loop_scope="module")
async def api(lanes: Served) -> AsyncIterator[openai.AsyncOpenAI]:
    async with client(lanes) as opened:
        yield opened


async def test_chat_routes_short_prompts_to_the_interactive_lane(api: openai.AsyncOpenAI) -> None:
    raw = await api.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": "Where is my parcel?"}],
        max_tokens=8,
    )
    completion = raw.parse()
    assert raw.headers["x-laneway-pool"] == "realtime"
    assert raw.headers["x-laneway-lane"] == "interactive"
    # The engine only answers its served name, llama-small; the client reads its own name.
    assert completion.model == "llama"
    assert completion.usage is not None
    # The gateway and the engine count the prompt with the same tokenizer.
    assert int(raw.headers["x-laneway-prompt-tokens"]) == completion.usage.prompt_tokens
    assert completion.usage.completion_tokens == 8
    assert completion.choices[0].message.content


async def test_chat_streams_chunk_by_chunk(api: openai.AsyncOpenAI) -> None:
    raw = await api.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert raw.headers["x-laneway-lane"] == "interactive"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = [chunk async for chunk in raw.parse()]
    pieces = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices]
    assert len([p for p in pieces if p]) == 12
    # Every chunk, the role chunk and the usage chunk too, names the model asked for.
    assert chunks[-1].usage is not None
    assert {chunk.model for chunk in chunks} == {"llama"}


def request_lines(stderr: str) -> list[dict[str, Any]]:
    """The gateway's per-request log lines among what it wrote to stderr."""
    lines = [line for line in stderr.splitlines() if line.startswith('{"ts"')]
    return [record for record in map(json.loads, lines) if "path" in record]


async def test_each_request_leaves_one_log_line_of_its_route_and_plan(
    api: openai.AsyncOpenAI, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # As `laneway gateway` configures logging; pytest's root logger says WARNING.
    caplog.set_level(logging.INFO, logger="laneway.gateway.requests")
    raw = await api.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": "Where is the parcel I sent on Monday?"}],
        max_tokens=6,
        stream=True,
    )
    assert [chunk async for chunk in raw.parse()]
    prompt_tokens = int(raw.headers["x-laneway-prompt-tokens"])
    written: list[str] = []

    def mine() -> list[dict[str, Any]]:
        written.append(capsys.readouterr().err)
        lines = request_lines("".join(written))
        return [r for r in lines if r.get("prompt_tokens") == prompt_tokens]

    # The line is written as the handler returns, which may be after the client has all.
    async def logged() -> bool:
        return bool(mine())

    await eventually(logged, "the request's log line", within=30)
    record = mine()[-1]
    assert record["path"] == "/v1/chat/completions"
    assert (record["status"], record["model"], record["stream"]) == (200, "llama", True)
    assert (record["pool"], record["lane"]) == ("realtime", "interactive")
    assert record["reason"]  # which rule chose the pool
    assert record["endpoint"].startswith("http://127.0.0.1:")
    assert record["attempts"] == 1
    assert record["predicted_ttft_ms"] > 0
    assert 0 < record["ttft_ms"] <= record["total_ms"]
    assert "error" not in record


async def test_completions_stream_and_not(api: openai.AsyncOpenAI) -> None:
    completion = await api.completions.create(model="llama", prompt="Once upon", max_tokens=5)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert completion.model == "llama"
    stream = await api.completions.create(
        model="llama", prompt="Once upon", max_tokens=6, stream=True
    )
    chunks = [chunk async for chunk in stream]
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len([t for t in texts if t]) == 6
    assert {chunk.model for chunk in chunks} == {"llama"}


async def test_long_documents_go_to_the_batch_lane(api: openai.AsyncOpenAI) -> None:
    document = "The supplier shall deliver the goods within thirty days. " * 400
    raw = await api.completions.with_raw_response.create(
        model="llama", prompt=document, max_tokens=4
    )
    completion = raw.parse()
    assert (raw.headers["x-laneway-pool"], raw.headers["x-laneway-lane"]) == ("batch", "batch")
    assert completion.model == "llama"  # served as llama-long by the batch engine
    assert completion.usage is not None
    assert int(raw.headers["x-laneway-prompt-tokens"]) == completion.usage.prompt_tokens
    assert completion.usage.prompt_tokens == default_tokenizer().count(document)


async def test_the_lane_header_pins_a_short_prompt_to_batch(api: openai.AsyncOpenAI) -> None:
    raw = await api.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": "nightly report"}],
        max_tokens=3,
        extra_headers={"x-laneway-lane": "batch"},
    )
    assert raw.headers["x-laneway-pool"] == "batch"
    bad = await api.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": "long essay " * 3000}],
        max_tokens=3,
        extra_headers={"x-laneway-lane": "interactive"},
    )
    assert bad.headers["x-laneway-lane"] == "batch"  # long prompts never spill into interactive


async def test_context_too_long_names_the_count_and_the_cap(api: openai.AsyncOpenAI) -> None:
    document = "word " * 140_000
    with pytest.raises(openai.BadRequestError) as error:
        await api.completions.create(model="llama", prompt=document, max_tokens=4)
    assert error.value.status_code == 400
    assert error.value.code == "context_length_exceeded"
    # Its lower bound alone is past every context: refused without counting it exactly.
    at_least = error.value.message.split("at least ", 1)[1].split()[0]
    assert 131072 < int(at_least) <= default_tokenizer().count(document)
    assert "131072" in error.value.message


async def test_unknown_model_is_404(api: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as error:
        await api.chat.completions.create(
            model="gpt-17", messages=[{"role": "user", "content": "hi"}]
        )
    assert error.value.code == "model_not_found"
    assert "llama" in error.value.message


async def test_models_lists_the_public_names(api: openai.AsyncOpenAI) -> None:
    assert [model.id async for model in api.models.list()] == ["llama"]


ONE_MESSAGE = [{"role": "user", "content": "x"}]
BAD_BODIES = [
    # (case, raw body, status, OpenAI error code)
    ("malformed JSON", b'{"model": "llama", "messages": [', 400, "invalid_request"),
    (
        "messages of the wrong type",
        json.dumps({"model": "llama", "messages": "hi"}).encode(),
        400,
        "invalid_request",
    ),
    (
        "max_tokens a string",
        json.dumps({"model": "llama", "messages": ONE_MESSAGE, "max_tokens": "9"}).encode(),
        400,
        "invalid_request",
    ),
    (
        "a huge body",
        b'{"model": "llama", "prompt": "' + b"a" * (MAX_BODY + 10) + b'"}',
        413,
        "body_too_large",
    ),
]


@pytest.mark.parametrize(
    ("raw", "status", "code"), [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES]
)
async def test_bad_bodies_get_openai_errors(
    lanes: Served, raw: bytes, status: int, code: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{lanes.url}/v1/chat/completions",
            data=io.BytesIO(raw),
            headers={"Content-Type": "application/json"},
        ) as response,
    ):
        assert response.status == status
        error = (await response.json())["error"]
    assert error["code"] == code
    assert error["type"] == "invalid_request_error"
    assert "Traceback" not in error["message"]


async def test_health_readiness_and_metrics(lanes: Served, api: openai.AsyncOpenAI) -> None:
    stream = await api.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "ping"}], max_tokens=64, stream=True
    )
    assert len([chunk async for chunk in stream]) >= 64
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz"):
            async with session.get(f"{lanes.url}{path}") as response:
                assert response.status == 200, path
    samples = await scrape(lanes.url)
    requests = "laneway_gateway_requests_total"
    assert total(samples, requests, pool="realtime", lane="interactive", status="200") >= 1
    assert total(samples, "laneway_gateway_ttft_seconds_count", pool="realtime") >= 1
    # Tokens that reach the relay in one read are one gap: a loaded machine may merge some.
    assert total(samples, "laneway_gateway_tbt_seconds_count", pool="realtime") >= 1
    assert total(samples, "laneway_gateway_request_seconds_count", lane="interactive") >= 1
    assert total(samples, "laneway_gateway_prompt_tokens_count", lane="interactive") >= 1
    assert total(samples, "laneway_gateway_queue_wait_seconds_count", pool="realtime") >= 1
    assert total(samples, "laneway_gateway_tokenization_seconds_count") >= 1
    assert total(samples, "laneway_gateway_queue_depth", pool="realtime") == 0
    assert total(samples, "laneway_gateway_endpoints", pool="batch", state="available") == 1


async def test_slo_attainment_and_learned_prefill_rates(
    lanes: Served, api: openai.AsyncOpenAI
) -> None:
    # About 600 prompt tokens: enough backlog for the gateway to learn a prefill rate from.
    question = "Which of the parcels in my last order left the warehouse, and when? " * 40
    for _ in range(2):
        stream = await api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": question}],
            max_tokens=64,
            stream=True,
        )
        assert len([chunk async for chunk in stream]) >= 64
    samples = await scrape(lanes.url)
    by_pool = {"pool": "realtime", "lane": "interactive"}
    # Every first token and every gap is counted as met or missed against the pool's SLO,
    # whose defaults (300 ms, 30 ms) sit on histogram bucket edges: the same comparisons.
    for slo, histogram, edge in (("ttft", "ttft_seconds", "0.3"), ("tbt", "tbt_seconds", "0.03")):
        counted = total(samples, f"laneway_gateway_slo_{slo}_total", **by_pool)
        assert counted == total(samples, f"laneway_gateway_{histogram}_count", **by_pool) >= 1
        met = total(samples, f"laneway_gateway_slo_{slo}_total", met="true", **by_pool)
        within = total(samples, f"laneway_gateway_{histogram}_bucket", le=edge, **by_pool)
        assert met == within
    rate_metric = "laneway_gateway_endpoint_prefill_seconds_per_token"
    assert {labels["pool"] for labels, _ in samples[rate_metric]} == {"realtime", "batch"}
    realtime_s = total(samples, rate_metric, pool="realtime")
    assert realtime_s > 0
    assert realtime_s != PRIOR_MS_PER_TOKEN / 1000  # learned from the streams above


async def test_the_gateway_reports_its_own_time_within_what_the_client_waited(
    lanes: Served, api: openai.AsyncOpenAI
) -> None:
    overhead = "laneway_gateway_overhead_seconds"
    before = await scrape(lanes.url)
    streams, waited_s, to_first_token_s = 4, 0.0, 0.0
    for _ in range(streams):
        begun = time.perf_counter()
        stream = await api.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "ping"}], max_tokens=8, stream=True
        )
        first_token_at = None
        async for chunk in stream:
            if first_token_at is None and chunk.choices and chunk.choices[0].delta.content:
                first_token_at = time.perf_counter()
        assert first_token_at is not None
        to_first_token_s += first_token_at - begun
        waited_s += time.perf_counter() - begun
    after = await scrape(lanes.url)

    def added(sample: str, stage: str) -> float:
        name = f"{overhead}_{sample}"
        return total(after, name, stage=stage) - total(before, name, stage=stage)

    # One observation per request for `request` and `stream`, one per relayed chunk.
    assert added("count", "request") == streams
    assert added("count", "stream") == streams
    assert added("count", "chunk") >= streams
    # The gateway's own time is a part of what the client waited for: its time before the
    # engine within the client's time to the first token, each stream's within the whole.
    assert 0 < added("sum", "request") < to_first_token_s
    assert added("sum", "request") < added("sum", "stream") < waited_s
    assert added("sum", "chunk") > 0


async def test_both_engine_flavors_are_scraped(lanes: Served) -> None:
    async def pools_scraped(metric: str) -> set[str]:
        samples = await scrape(lanes.url)
        return {labels["pool"] for labels, _ in samples.get(metric, [])}

    async def both() -> bool:
        return await pools_scraped("laneway_gateway_engine_kv_usage") == {"realtime", "batch"}

    # The interactive engine speaks vLLM's metric names, the batch one SGLang's.
    await eventually(both, "both engines' /metrics to be read")
    waiting = "laneway_gateway_engine_waiting_requests"
    assert await pools_scraped(waiting) == {"realtime", "batch"}

    async def idle() -> bool:
        return total(await scrape(lanes.url), waiting) == 0

    # Earlier tests' requests leave the engines within a scrape or two, later on a busy machine.
    await eventually(idle, "both engines' waiting requests, as scraped, to fall to zero")
