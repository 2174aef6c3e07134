"""Request traces the `vllm` tier sends to real vLLM and to `laneway sim` alike, and what the
engine's own /metrics says about them: the same trace, the same scheduler settings, so the
two engines' behaviour can be compared where it is observable (docs/SIMULATOR.md)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import aiohttp

from support.chat_model import user
from support.client import Listening, eventually, scrape, total

ENDLESS = 1800  # output tokens of a stream that would run for minutes if nobody stopped it


async def engine_value(engine: Listening, name: str) -> float:
    return total(await scrape(engine.url), name)


async def until(engine: Listening, name: str, wanted: Callable[[float], bool], what: str) -> None:
    async def holds() -> bool:
        return wanted(await engine_value(engine, name))

    await eventually(holds, what, within=120)


async def idle(engine: Listening) -> None:
    """Until the engine runs and queues nothing: the session's one vLLM serves every test,
    and a request an earlier test left (a stream whose abort vLLM has not yet seen, one
    still finishing its tokens) would change what the next test counts. Generous: such a
    request may run to its end, minutes on these cores."""

    async def holds() -> bool:
        samples = await scrape(engine.url)
        return all(total(samples, f"vllm:num_requests_{state}") == 0
                   for state in ("running", "waiting"))  # fmt: skip

    await eventually(holds, "the engine running and queueing nothing", within=600)


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
    """A stream of ENDLESS tokens, read until it is cancelled (which closes the connection)."""
    body = {"model": model, "messages": user(text), "max_tokens": ENDLESS, "stream": True,
            "ignore_eos": True}  # fmt: skip
    async with session.post(f"{url}/chat/completions", json=body) as answer:
        async for _ in answer.content:
            pass


async def answered(
    session: aiohttp.ClientSession, url: str, model: str, priority: int, order: list[int]
) -> None:
    """A one-token chat with `priority`; appends the priority once it is answered."""
    body = {"model": model, "messages": user(f"urgent? {priority}"), "max_tokens": 1,
            "priority": priority}  # fmt: skip
    async with session.post(f"{url}/chat/completions", json=body) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()
    order.append(priority)


def equals(count: int) -> Callable[[float], bool]:
    return lambda value: value == count


async def priority_order(engine: Listening, url: str, model: str, slots: int) -> list[int]:
    """`slots` endless streams fill the engine's running batch (its max-num-seqs); requests
    of priorities 5, 0, 3 arrive in that order and wait; one stream ends, so one slot frees
    at a time, and they are answered in the order the engine admits them. `url`: the engine's
    or a gateway's /v1 in front of it."""
    order: list[int] = []
    async with aiohttp.ClientSession() as session:
        blockers = [asyncio.create_task(endless(session, url, model)) for _ in range(slots)]
        try:
            await until(engine, "vllm:num_requests_running", lambda n: n == slots, "a full batch")
            asked: list[asyncio.Task[None]] = []
            for queued, priority in enumerate((5, 0, 3), start=1):
                asked.append(asyncio.create_task(answered(session, url, model, priority, order)))
                # One at a time, so the engine's arrival order is the order sent.
                await until(engine, "vllm:num_requests_waiting", equals(queued), "in line")
            blockers[0].cancel()
            await asyncio.gather(*asked)
        finally:
            for blocker in blockers:
                blocker.cancel()
            await asyncio.gather(*blockers, return_exceptions=True)
    await until(engine, "vllm:num_requests_running", lambda n: n == 0, "the engine idle again")
    return order
