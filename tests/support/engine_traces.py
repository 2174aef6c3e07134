"""Request traces the `vllm` tier sends to real vLLM and to `laneway sim` alike, and what the
engine's own /metrics says about them: the same trace, the same scheduler settings, so the
two engines' behaviour can be compared where it is observable (docs/SIMULATOR.md)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable

import aiohttp

from support.chat_model import user
from support.client import Listening, eventually, scrape, total
from support.vllm_engine import MAX_MODEL_LEN

# Output tokens of a stream that runs for minutes unless it is stopped (over two at vLLM's
# best decode here, support.vllm_engine): the engines' context cap less room for the prompt.
ENDLESS = MAX_MODEL_LEN - 512


async def engine_value(engine: Listening, name: str) -> float:
    return total(await scrape(engine.url), name)


def still_running(streams: Iterable[asyncio.Task[None]]) -> None:
    """Fail at once, with the engine's answer, if a stream a wait relies on ended (other
    than by the test's cancel): a refused or dropped blocker would otherwise show only as
    the wait's timeout minutes later."""
    for stream in streams:
        if stream.done() and not stream.cancelled():
            stream.result()  # raises what ended it: its status and body, or the error
            raise AssertionError("a request for ENDLESS tokens ended before it was closed")


async def until(
    engine: Listening,
    name: str,
    wanted: Callable[[float], bool],
    what: str,
    *,
    streams: Iterable[asyncio.Task[None]] = (),
) -> None:
    """Until the engine's `name` is `wanted`; `streams`: the requests that state relies on,
    any of which ending fails the wait at once."""
    relied_on = tuple(streams)

    async def holds() -> bool:
        still_running(relied_on)
        return wanted(await engine_value(engine, name))

    await eventually(holds, what, within=120)


async def idle(
    engine: Listening,
    what: str = "the engine running and queueing nothing",
    *,
    within: float = 600,
) -> None:
    """Until the engine runs and queues nothing: the session's one vLLM serves every test,
    and a request an earlier test left (a stream whose abort vLLM has not yet seen, one
    still finishing its tokens) would change what the next test counts. Generous: such a
    request may run to its end, minutes on these cores."""

    async def holds() -> bool:
        samples = await scrape(engine.url)
        return all(total(samples, f"vllm:num_requests_{state}") == 0
                   for state in ("running", "waiting"))  # fmt: skip

    await eventually(holds, what, within=within)


def document(words: int = 120) -> str:
    """A prompt no earlier request cached: a fresh first block, so every hit is its own."""
    return f"{uuid.uuid4().hex} " + " ".join(["prefill decode chunk lane"] * (words // 4))


async def tokenized_ids(
    session: aiohttp.ClientSession, engine: Listening, model: str, text: str
) -> list[int]:
    """The engine's own token ids of a one-message chat, from its /tokenize."""
    body = {"model": model, "messages": user(text)}
    async with session.post(f"{engine.url}/tokenize", json=body) as answer:
        assert answer.status == 200, await answer.text()
        tokens: list[int] = (await answer.json())["tokens"]
    return tokens


async def endless(
    session: aiohttp.ClientSession, url: str, model: str, text: str = "go on"
) -> None:
    """A request for ENDLESS tokens, waited on until it is cancelled (which closes the
    connection: vLLM aborts a request whose client left, streamed or not); a refusal fails
    it with the engine's status and body. Not streamed: an SSE event a token, at vLLM's
    pace here, kept its API server too busy to answer /metrics for tens of seconds."""
    body = {"model": model, "messages": user(text), "max_tokens": ENDLESS, "ignore_eos": True}
    async with session.post(f"{url}/chat/completions", json=body) as answer:
        assert answer.status == 200, f"a blocking request: {answer.status} {await answer.text()}"
        await answer.read()


async def first_token(
    session: aiohttp.ClientSession, url: str, model: str, priority: int, started: asyncio.Event
) -> None:
    """An endless stream with `priority`, read until it is cancelled; `started` is set at its
    first event, which vLLM and `laneway sim` both send with the first token (after the
    prefill), never when the request arrives: the stream has been admitted."""
    body = {"model": model, "messages": user(f"urgent? {priority}"), "max_tokens": ENDLESS,
            "stream": True, "ignore_eos": True, "priority": priority}  # fmt: skip
    async with session.post(f"{url}/chat/completions", json=body) as answer:
        assert answer.status == 200, f"a waiting stream: {answer.status} {await answer.text()}"
        async for line in answer.content:
            if line.startswith(b"data:"):
                started.set()


def equals(count: int) -> Callable[[float], bool]:
    return lambda value: value == count


PRIORITIES = (5, 0, 3)  # in the order they arrive


async def priority_order(engine: Listening, url: str, model: str, slots: int) -> list[int]:
    """The order an engine admits waiting requests of PRIORITIES, each step a state the
    engine holds until the test changes it, so the answer is the engine's whatever the
    machine's timing: `slots` endless streams fill its running batch (its max-num-seqs);
    endless streams of PRIORITIES arrive one at a time, each seen waiting before the next
    is sent; then one slot is freed, the one stream admitted into it is seen starting (its
    first token) while the others still wait, and that stream is closed to free the slot for
    the next. `url`: the engine's or a gateway's /v1 in front of it."""
    order: list[int] = []
    started = {priority: asyncio.Event() for priority in PRIORITIES}
    async with aiohttp.ClientSession() as session:
        blockers = [asyncio.create_task(endless(session, url, model)) for _ in range(slots)]
        waiters: dict[int, asyncio.Task[None]] = {}
        try:
            await until(
                engine, "vllm:num_requests_running", equals(slots), "a full batch",
                streams=blockers,
            )  # fmt: skip
            for queued, priority in enumerate(PRIORITIES, start=1):
                waiters[priority] = asyncio.create_task(
                    first_token(session, url, model, priority, started[priority])
                )
                # One at a time, so the engine's arrival order is the order sent.
                await until(
                    engine, "vllm:num_requests_waiting", equals(queued), "in line",
                    streams=(*blockers, *waiters.values()),
                )  # fmt: skip
            leaving = blockers[0]
            for _ in PRIORITIES:
                leaving.cancel()  # its connection closes: the engine aborts it, a slot frees

                def admitted() -> list[int]:
                    return [p for p in PRIORITIES if p not in order and started[p].is_set()]

                async def one_admitted() -> bool:
                    still_running((*blockers, *waiters.values()))
                    return bool(admitted())

                await eventually(one_admitted, "a waiting stream's first token", within=120)
                now = admitted()
                # The other slot's stream never ends on its own (ENDLESS): one slot was free.
                assert len(now) == 1, f"streams {now} started at once: two slots were free"
                order.append(now[0])
                leaving = waiters[now[0]]
        finally:
            for task in (*blockers, *waiters.values()):
                task.cancel()
            await asyncio.gather(*blockers, *waiters.values(), return_exceptions=True)
    await until(engine, "vllm:num_requests_running", equals(0), "the engine idle again")
    return order
