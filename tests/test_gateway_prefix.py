"""Prefix affinity through the real gateway: two `laneway sim` engines, one pool, default weights.

A multi-turn session (each turn resends the whole conversation, here as one completions
prompt) stays on the engine that holds its prefix while the engines are equally loaded, and
the engine's own prefix cache hits; once that engine is hot (a long prefill the gateway
routed there), the next turn goes elsewhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest
from support.client import client, eventually, scrape, total
from support.launch import start_gateway
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.procs import ChildProcess, Children
from laneway.tokens import default_tokenizer

# Slower than real time: the hot engine's long prefill outlasts routing the next turn by far.
TIME_SCALE = "0.25"
CONTEXT = 131072
SYSTEM = " ".join(
    f"Returns policy clause {i}: keep the receipt for thirty days." for i in range(80)
)
FILLER = "lorem ipsum dolor sit amet " * 16000  # about 80,000 tokens


@pytest.fixture
def children() -> Iterator[Children]:
    with Children(stop_grace=10) as started:
        yield started


async def served(engine: ChildProcess) -> float:
    return total(await scrape(engine.url), "vllm:request_success_total")


async def test_a_session_stays_on_its_engine_until_that_engine_is_hot(
    children: Children, tmp_path: Path
) -> None:
    args = ["--max-context", str(CONTEXT), "--time-scale", TIME_SCALE]
    engines = [
        children.start_laneway(
            "sim",
            ["--host", "127.0.0.1", "--port", "0", "--model", "llama-small", *args],
            name=f"sim {index}",
        )
        for index in range(2)
    ]
    gateway = start_gateway(
        children,
        tmp_path / "gateway.yaml",
        [
            pool_doc(
                "chat",
                "interactive",
                "llama-small",
                [engine.url for engine in engines],
                limits={"maxContextTokens": CONTEXT},
            ),
            gateway_doc(maxBodyBytes=4 * 1024 * 1024),  # default picking: prefixAffinity 6
        ],
    )
    conversation = SYSTEM
    async with client(gateway) as api:

        async def turn(question: str) -> None:
            nonlocal conversation
            conversation += f"\nUser: {question}\nAssistant:"
            reply = await api.completions.create(model="llama", prompt=conversation, max_tokens=2)
            conversation += reply.choices[0].text

        # Equal load (one request at a time): every turn goes where the history is cached.
        for number in range(5):
            await turn(f"Question {number}: can I return an opened item?")
        counts = [await served(engine) for engine in engines]
        assert sorted(counts) == [0, 5], counts
        home, other = (engines[0], engines[1]) if counts[0] else (engines[1], engines[0])
        # Turns 2-5 each found at least the system prompt's whole blocks in the engine's cache.
        system_blocks = default_tokenizer().count(SYSTEM) // 16
        hits = total(await scrape(home.url), "vllm:prefix_cache_hits_total")
        assert hits >= 4 * system_blocks * 16

        # A long document behind the same system prompt: affinity sends it home too, and
        # there it is prefill the gateway knows is still ahead of any new first token.
        hot = await api.completions.create(
            model="llama", prompt=SYSTEM + FILLER, max_tokens=1, stream=True
        )
        try:
            home_metrics = await scrape(home.url)
            queued = ("vllm:num_requests_running", "vllm:num_requests_waiting")
            assert sum(total(home_metrics, name) for name in queued) == 1
            await turn("And without the receipt?")
            assert await served(other) == 1, "the hot engine kept the session's next turn"
            assert await served(home) == 5, "the long document finished before the turn"
        finally:
            await hot.close()


async def test_an_engine_that_restarts_empty_is_forgotten_by_the_prefix_index(
    children: Children, tmp_path: Path
) -> None:
    engine = children.start_laneway(
        "sim",
        ["--host", "127.0.0.1", "--port", "0", "--model", "llama-small", "--time-scale", "1"],
        name="sim before restart",
    )
    gateway = start_gateway(
        children,
        tmp_path / "gateway.yaml",
        [
            pool_doc("chat", "interactive", "llama-small", [engine.url]),
            gateway_doc(
                scrape={"intervalMillis": 100, "staleAfterMillis": 5000},
                health={"failuresToEject": 1, "checkIntervalMillis": 100},
            ),
        ],
    )

    async def gauge(name: str) -> float:
        return total(await scrape(gateway.url), name, endpoint=engine.url)

    async with client(gateway) as api:
        stream = await api.completions.create(
            model="llama", prompt=SYSTEM, max_tokens=4000, stream=True
        )
        assert await gauge("laneway_gateway_prefix_index_blocks") > 0
        # A scrape that saw the request in the engine also saw its prefix-cache queries.
        await eventually(
            lambda: _above_zero(gauge("laneway_gateway_engine_kv_usage")), "a busy scrape"
        )
        engine.kill_now()
        await stream.close()
    port = engine.url.rsplit(":", 1)[1]
    children.start_laneway(
        "sim",
        ["--host", "127.0.0.1", "--port", port, "--model", "llama-small"],
        name="sim after restart",
    )
    # Readmitted, scraped: its counter went back to 0, so the index forgot the endpoint.
    await eventually(
        lambda: _is_zero(gauge("laneway_gateway_prefix_index_blocks")),
        "the index to forget the restarted engine",
        within=60,
    )


async def _above_zero(value: Awaitable[float]) -> bool:
    return await value > 0


async def _is_zero(value: Awaitable[float]) -> bool:
    return await value == 0
