"""The gateway acts on the ledger's lending decisions, over HTTP with `laneway sim` engines: a
lending pool lends its idle replica to the batch pool, a document runs there, chat demand
takes the replica back (the engine aborts the document: the gateway closed its upstream
request), chat is served there, and the document, requeued, is sent again once a replica is
lent again and completes, hitting the prefix its first attempt left in that engine's cache;
the gateway counts the prefill its resend computed twice from what the engine reported cached.

No timing is asserted: every wait polls with a generous limit."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import openai
import pytest
from support.client import client, eventually, scrape, total
from support.inproc import Served, Servers
from support.pools import LENDING_CONTEXT, lending_docs

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.keys import LEDGER, LENDING
from laneway.gateway.serving.lending import Mode
from laneway.ledger import Ledger, Role

# About 8k tokens of prose: a prefill of several engine steps.
DOCUMENT = "The parcel left the warehouse on Monday and reached the depot by noon. " * 600
# About 100k tokens: a prefill of seconds at time scale 1, during which chat takes its
# replica back.
LONG_DOCUMENT = DOCUMENT * 12
CONTEXT = LENDING_CONTEXT
# Long enough a decode that the document still runs when chat takes its replica back.
DOCUMENT_OUTPUT = 6000
TIME_SCALE = "4"


async def engine(servers: Servers) -> Served:
    return await servers.sim(
        "llama-long", "--time-scale", TIME_SCALE, "--max-context", str(CONTEXT)
    )


def lent(ledger: Ledger) -> list[str]:
    chat = next(pool for pool in ledger.pools() if pool.name == "chat")
    return [url for url, role in ledger.roles(chat).items() if role is Role.LENT]


async def count(url: str, name: str, **labels: str) -> float:
    return total(await scrape(url), name, **labels)


async def finished_other_than_abort(url: str) -> float:
    samples = await scrape(url)
    return sum(
        value
        for labels, value in samples.get("vllm:request_success_total", [])
        if labels.get("finished_reason") != "abort"
    )


async def logged_line(capsys: pytest.CaptureFixture[str], lane: str) -> dict[str, Any]:
    """The gateway's first log line of a request in `lane`, once it wrote it to stderr."""
    written: list[str] = []
    async with asyncio.timeout(30):
        while True:
            written.append(capsys.readouterr().err)
            lines = [json.loads(line) for line in "".join(written).splitlines() if line[:1] == "{"]
            found = [line for line in lines if line.get("lane") == lane and "path" in line]
            if found:
                return dict(found[0])
            await asyncio.sleep(0.05)


async def test_a_lent_replica_is_sent_its_lenders_model_name(
    servers: Servers, tmp_path: Path
) -> None:
    """The same model under another served name in the borrower: the lent engine serves
    only the lender's name, so the document must name that one there."""
    engines = [await engine(servers), await engine(servers)]
    documents = lending_docs([e.url for e in engines])
    documents[1]["spec"]["servedModelName"] = "llama-docs"
    gateway = await servers.gateway(tmp_path / "gateway.yaml", documents)
    ledger = gateway.runner.app[LEDGER]
    api = client(gateway)

    async def one_lent() -> bool:
        return len(lent(ledger)) == 1

    await eventually(one_lent, "the idle replica lent to the batch pool")
    try:
        done = await api.completions.create(
            model="llama",
            prompt=DOCUMENT,
            max_tokens=4,
            extra_headers={"x-laneway-lane": "batch"},
        )
    finally:
        await api.close()
    assert done.choices[0].text
    assert done.model == "llama"


async def test_chat_takes_a_lent_replica_back_and_the_document_is_resent(
    servers: Servers,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # As `laneway gateway` configures logging; pytest's root logger says WARNING.
    caplog.set_level(logging.INFO, logger="laneway.gateway.requests")
    engines = [await engine(servers), await engine(servers)]
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", lending_docs([e.url for e in engines])
    )
    ledger = gateway.runner.app[LEDGER]
    api = client(gateway)
    by_url = {e.url: e for e in engines}

    async def one_lent() -> bool:
        return len(lent(ledger)) == 1

    # No chat: all but keepReplicas are lent.
    await eventually(one_lent, "the idle replica lent to the batch pool")
    (borrowed_url,) = lent(ledger)
    borrowed = by_url[borrowed_url]
    (home,) = (e for e in engines if e is not borrowed)

    async def document() -> Any:
        return await api.completions.create(
            model="llama",
            prompt=DOCUMENT,
            max_tokens=DOCUMENT_OUTPUT,
            extra_headers={"x-laneway-lane": "batch"},
        )

    doc = asyncio.create_task(document())
    chat_a = None
    try:

        async def doc_decoding() -> bool:
            return await count(borrowed.url, "vllm:time_to_first_token_seconds_count") == 1

        # Its whole prompt prefilled there: the blocks an abort leaves in the prefix cache.
        await eventually(doc_decoding, "the document decoding on the lent replica")
        hits_before = await count(borrowed.url, "vllm:prefix_cache_hits_total")

        # A chat turn on the one serving replica, held open while the test goes on.
        chat_a = await api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=20000,
            stream=True,
        )
        await anext(aiter(chat_a))
        # A second turn needs a second replica: the lent one is taken back for it.
        # Streamed, so that its first token is the gateway's to see.
        answer = await api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "and a short one"}],
            max_tokens=8,
            stream=True,
        )
        said = [chunk.choices[0].delta.content async for chunk in answer if chunk.choices]
        assert "".join(filter(None, said))

        # The engine aborted the document (its upstream request closed), and served the
        # chat turn that took its replica back.
        reason = {"finished_reason": "abort"}
        assert await count(borrowed.url, "vllm:request_success_total", **reason) == 1
        assert await finished_other_than_abort(borrowed.url) == 1  # that chat turn
        assert await finished_other_than_abort(home.url) == 0  # chat A is still running
        reclaimed = await count(gateway.url, "laneway_gateway_reclaimed_requests_total")
        assert reclaimed == 1
        # The short turn's first token there ended the reclaim: its latency is observed.
        assert await count(gateway.url, "laneway_gateway_reclaim_seconds_count") == 1

        # The short turn ended: the replica with no chat on it is lent again, the document
        # is sent to it anew and completes there, its first attempt's prefix still cached.
        completed = await asyncio.wait_for(doc, 120)
        assert completed.choices[0].finish_reason == "length"
        assert await finished_other_than_abort(borrowed.url) == 2
        hits = await count(borrowed.url, "vllm:prefix_cache_hits_total") - hits_before
        assert completed.usage is not None
        assert hits >= 0.9 * completed.usage.prompt_tokens
        assert lent(ledger) == [borrowed.url]

        # The first attempt had prefilled its whole prompt (it was decoding); the resend
        # took all but the partial last block from the cache, as its usage says, and
        # computed the rest again: the count the log line and the metric carry.
        details = completed.usage.prompt_tokens_details
        assert details is not None
        assert details.cached_tokens is not None
        recomputed = completed.usage.prompt_tokens - details.cached_tokens
        assert 0 < recomputed <= 16  # the sim's block: the last, partial one
        line = await logged_line(capsys, "batch")
        assert (line["requeued"], line["recomputed_prompt_tokens"]) == (1, recomputed)
        name = "laneway_gateway_recomputed_prompt_tokens_total"
        assert await count(gateway.url, name, pool="docs") == recomputed
    finally:
        doc.cancel()
        if chat_a is not None:
            await chat_a.close()
        await api.close()


async def test_a_streamed_document_taken_back_after_its_first_tokens_ends_with_an_error(
    servers: Servers, tmp_path: Path
) -> None:
    """Its client has tokens that a second attempt would repeat: the stream ends with a
    `replica_reclaimed` error event instead, and the engine aborted it all the same."""
    engines = [await engine(servers), await engine(servers)]
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", lending_docs([e.url for e in engines])
    )
    ledger = gateway.runner.app[LEDGER]
    api = client(gateway)

    async def one_lent() -> bool:
        return len(lent(ledger)) == 1

    await eventually(one_lent, "the idle replica lent to the batch pool")
    (borrowed_url,) = lent(ledger)
    chat_a = None
    try:
        doc = await api.completions.create(
            model="llama",
            prompt=DOCUMENT,
            max_tokens=20000,  # still streaming when chat takes its replica back
            stream=True,
            extra_headers={"x-laneway-lane": "batch"},
        )
        events = aiter(doc)
        await anext(events)  # a token: the client has seen the document's answer begin
        chat_a = await api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=20000,
            stream=True,
        )
        await anext(aiter(chat_a))
        answer = await api.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "and a short one"}], max_tokens=8
        )
        assert answer.choices[0].message.content
        with pytest.raises(openai.APIError) as raised:
            async for _ in events:
                pass
        assert "taken back" in str(raised.value)
        reason = {"finished_reason": "abort"}
        assert await count(borrowed_url, "vllm:request_success_total", **reason) == 1
    finally:
        if chat_a is not None:
            await chat_a.close()
        await api.close()


async def test_two_gateway_replicas_lend_and_take_back_together(
    servers: Servers, tmp_path: Path, redis_server: LocalRedis
) -> None:
    """Two gateway replicas on one Redis: the leader lends the idle replica, and the other
    one follows: its documents go to the lent replica and its chat does not. Chat demand on
    the follower alone makes the leader take the replica back, and the follower ends its
    own document there (the engine aborts it) and serves its chat turn there; demand falls
    again, and both lend the replica again, the requeued document resent there."""
    engines = [await engine(servers), await engine(servers)]
    docs = lending_docs([e.url for e in engines])
    flags = ("--redis-url", redis_server.url)
    gateways = [
        await servers.gateway(tmp_path / f"gateway-{i}.yaml", docs, *flags) for i in range(2)
    ]
    ledgers = [g.runner.app[LEDGER] for g in gateways]

    async def both_lent_one() -> bool:
        found = [lent(ledger) for ledger in ledgers]
        return len(found[0]) == 1 and found[0] == found[1]

    await eventually(both_lent_one, "one replica lent, as both gateway replicas see it")
    modes = {g.runner.app[LENDING].mode for g in gateways}
    assert modes == {Mode.LEADING, Mode.FOLLOWING}
    (follower,) = (g for g in gateways if g.runner.app[LENDING].mode is Mode.FOLLOWING)
    (borrowed_url,) = lent(ledgers[0])
    by_url = {e.url: e for e in engines}
    borrowed = by_url[borrowed_url]
    (home,) = (e for e in engines if e is not borrowed)
    api = client(follower)

    doc = asyncio.create_task(
        api.completions.create(
            model="llama",
            prompt=DOCUMENT,
            max_tokens=DOCUMENT_OUTPUT,
            extra_headers={"x-laneway-lane": "batch"},
        )
    )
    chat_a = None
    try:

        async def doc_decoding() -> bool:
            return await count(borrowed.url, "vllm:time_to_first_token_seconds_count") == 1

        await eventually(doc_decoding, "the follower's document decoding on the lent replica")
        # The follower's chat goes to the replica still serving chat, not the lent one.
        chat_a = await api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=20000,
            stream=True,
        )
        await anext(aiter(chat_a))
        assert await count(home.url, "vllm:num_requests_running") == 1
        # A second turn on the follower needs a second replica: the leader, told of the
        # follower's demand through Redis, takes the lent one back.
        answer = await api.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "and a short one"}], max_tokens=8
        )
        assert answer.choices[0].message.content
        reason = {"finished_reason": "abort"}
        assert await count(borrowed.url, "vllm:request_success_total", **reason) == 1
        assert await finished_other_than_abort(borrowed.url) == 1  # the short turn
        assert await count(follower.url, "laneway_gateway_reclaimed_requests_total") == 1
        for ledger in ledgers:
            assert borrowed_url not in lent(ledger)
        # The short turn ended: demand fell, the leader lends the replica again, and the
        # follower's requeued document is resent there and completes.
        completed = await asyncio.wait_for(doc, 120)
        assert completed.choices[0].finish_reason == "length"
        assert await finished_other_than_abort(borrowed.url) == 2
        assert all(lent(ledger) == [borrowed_url] for ledger in ledgers)
    finally:
        doc.cancel()
        if chat_a is not None:
            await chat_a.close()
        await api.close()


async def test_the_batches_api_runs_its_items_on_the_lent_replica(
    servers: Servers, tmp_path: Path, redis_server: LocalRedis
) -> None:
    """The dispatcher's items run through the batch lane, so they go where chat lent a
    replica (the borrower has none of its own here); one gateway replica on Redis lends."""
    engines = [await engine(servers), await engine(servers)]
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml",
        lending_docs([e.url for e in engines]),
        *("--redis-url", redis_server.url),
    )
    ledger = gateway.runner.app[LEDGER]
    api = client(gateway)

    async def one_lent() -> bool:
        return len(lent(ledger)) == 1

    await eventually(one_lent, "the idle replica lent to the batch pool")
    (borrowed_url,) = lent(ledger)
    (home_url,) = (e.url for e in engines if e.url != borrowed_url)
    try:
        lines = [
            json.dumps(
                {
                    "custom_id": f"doc-{i}",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"model": "llama", "prompt": f"summarise report {i}", "max_tokens": 4},
                }
            )
            for i in range(3)
        ]
        uploaded = await api.files.create(
            file=("items.jsonl", "\n".join(lines).encode()), purpose="batch"
        )
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
        )

        async def completed() -> bool:
            return (await api.batches.retrieve(batch.id)).status == "completed"

        await eventually(completed, "the batch completed", within=120)
        done = await api.batches.retrieve(batch.id)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
        assert await finished_other_than_abort(borrowed_url) == 3
        assert await finished_other_than_abort(home_url) == 0
    finally:
        await api.close()


@pytest.mark.parametrize("usage", [False, True], ids=["no usage asked", "usage asked"])
async def test_a_stream_taken_back_in_its_prefill_goes_on_with_the_resent_attempt(
    usage: bool,
    servers: Servers,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its client has had nothing but the stream's head: the gateway resends the document
    and relays the second attempt's tokens into the same stream. Its count of prefill
    computed twice is the bound, the ended attempt taken to have prefilled the whole prompt:
    the whole prompt again where the resend's stream reports no usage, less the tokens its
    engine found cached where it does."""
    caplog.set_level(logging.INFO, logger="laneway.gateway.requests")
    engines = [
        await servers.sim("llama-long", "--time-scale", "1", "--max-context", str(CONTEXT))
        for _ in range(2)
    ]
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml", lending_docs([e.url for e in engines])
    )
    ledger = gateway.runner.app[LEDGER]
    api = client(gateway)

    async def one_lent() -> bool:
        return len(lent(ledger)) == 1

    await eventually(one_lent, "the idle replica lent to the batch pool")
    (borrowed_url,) = lent(ledger)

    async def document() -> list[Any]:
        stream = await api.completions.create(
            model="llama",
            prompt=LONG_DOCUMENT,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True} if usage else None,
            extra_headers={"x-laneway-lane": "batch"},
        )
        return [chunk async for chunk in stream]

    doc = asyncio.create_task(document())
    chat_a = None
    try:

        async def prefilling() -> bool:
            samples = await scrape(borrowed_url)
            return (
                total(samples, "vllm:num_requests_running") == 1
                and total(samples, "vllm:time_to_first_token_seconds_count") == 0
            )

        await eventually(prefilling, "the long document prefilling on the lent replica")
        chat_a = await api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "tell me a long story"}],
            max_tokens=20000,
            stream=True,
        )
        await anext(aiter(chat_a))
        answer = await api.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "and a short one"}], max_tokens=8
        )
        assert answer.choices[0].message.content
        reason = {"finished_reason": "abort"}
        assert await count(borrowed_url, "vllm:request_success_total", **reason) == 1
        chunks = await asyncio.wait_for(doc, 180)
        texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
        assert len([t for t in texts if t]) == 4  # the second attempt's tokens, once each
        assert await count(borrowed_url, "vllm:prefix_cache_hits_total") > 0
        line = await logged_line(capsys, "batch")
        assert line["requeued"] == 1
        cached = 0
        if usage:
            (reported,) = [chunk.usage for chunk in chunks if chunk.usage is not None]
            assert reported.prompt_tokens_details is not None
            cached = reported.prompt_tokens_details.cached_tokens or 0
            assert cached > 0  # the blocks the ended attempt prefilled
        assert line["recomputed_prompt_tokens"] == line["prompt_tokens"] - cached > 0
    finally:
        doc.cancel()
        if chat_a is not None:
            await chat_a.close()
        await api.close()


async def test_with_redis_away_both_gateway_replicas_take_the_lent_replica_back(
    servers: Servers, tmp_path: Path, redis_server: LocalRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """The roles cannot be shared: neither replica lends on its own (they would decide at
    odds); each takes the lent replica back and says why once, and they lend again, one
    leading, when Redis is back."""
    caplog.set_level(logging.INFO, logger="laneway.gateway.lending")
    engines = [await engine(servers), await engine(servers)]
    docs = lending_docs([e.url for e in engines])
    flags = ("--redis-url", redis_server.url)
    gateways = [
        await servers.gateway(tmp_path / f"gateway-{i}.yaml", docs, *flags) for i in range(2)
    ]
    ledgers = [g.runner.app[LEDGER] for g in gateways]

    def lent_on_both(expected: int) -> Any:
        async def check() -> bool:
            return all(len(lent(ledger)) == expected for ledger in ledgers)

        return check

    await eventually(lent_on_both(1), "one replica lent on both gateway replicas")
    await asyncio.to_thread(redis_server.stop)
    await eventually(lent_on_both(0), "the lent replica taken back on both")
    await asyncio.sleep(1.0)  # many lending ticks with Redis away
    unshared = [r for r in caplog.records if "lending_unshared" in r.getMessage()]
    assert len(unshared) == 2  # once per gateway replica
    assert "redis is unreachable" in unshared[0].getMessage()
    await asyncio.to_thread(redis_server.start)
    await eventually(lent_on_both(1), "lending again once Redis is back")
    modes = {g.runner.app[LENDING].mode for g in gateways}
    assert modes == {Mode.LEADING, Mode.FOLLOWING}


async def test_when_the_leader_stops_the_follower_leads_and_keeps_the_lent_replica(
    servers: Servers, tmp_path: Path, redis_server: LocalRedis
) -> None:
    """A leader shutting down hands the lease back: the follower takes it on its next tick
    and decides from the roles it had adopted, so the lent replica stays lent."""
    engines = [await engine(servers), await engine(servers)]
    docs = lending_docs([e.url for e in engines])
    flags = ("--redis-url", redis_server.url)
    gateways = [
        await servers.gateway(tmp_path / f"gateway-{i}.yaml", docs, *flags) for i in range(2)
    ]

    def mode(gateway: Served) -> Mode | None:
        lending = gateway.runner.app[LENDING]
        assert lending is not None
        return lending.mode

    async def one_leads() -> bool:
        return {mode(g) for g in gateways} == {Mode.LEADING, Mode.FOLLOWING}

    await eventually(one_leads, "one gateway replica leading, one following")
    (leader,) = (g for g in gateways if mode(g) is Mode.LEADING)
    (follower,) = (g for g in gateways if g is not leader)
    ledger = follower.runner.app[LEDGER]

    async def one_lent() -> bool:
        return len(lent(ledger)) == 1

    await eventually(one_lent, "the follower sees one replica lent")
    (borrowed_url,) = lent(ledger)
    assert leader.listener is not None
    leader.listener.close()
    await leader.runner.cleanup()
    seen: list[list[str]] = []

    async def leads() -> bool:
        seen.append(lent(ledger))
        return mode(follower) is Mode.LEADING

    await eventually(leads, "the follower leading")
    for _ in range(10):  # and deciding: still lent, and never taken back meanwhile
        seen.append(lent(ledger))
        await asyncio.sleep(0.05)
    assert all(found == [borrowed_url] for found in seen)
