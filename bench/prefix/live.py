"""`laneway bench prefix --mode live`: the prefix workloads over HTTP, through the real gateway.

Per picker: one `laneway sim` per replica of the scenario's chat and document pools (prefix
caching on, as in vLLM), the real `laneway gateway` configured with those InferencePools and
the picker's picking configuration (`prefix_experiment.picker_settings`, the very settings
the virtual run routes with), and a client that plays the same sessions as the virtual run:
each session draws its turns, message lengths, answers and think times from the same
seeded stream (`{seed}/session/{key}`). Chat turns resend the system prompt and the whole
history (the engine's answers included) with a new message; document sessions ask their
questions over one long document, pinned to the batch lane with `x-laneway-lane`. Every
request carries `x-laneway-session`, which only the sticky picker's scorer reads.

Measured where a user would: TTFT at the client (first content token, in model time); hit
rate, prefill tokens and busy time from the engines' own /metrics (`vllm:prefix_cache_*`,
`laneway_engine_busy_seconds`), as deltas over the run.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from laneway.bench.harness.live_cluster import engine_counters, gateway_config, start_cluster
from laneway.bench.harness.loadgen import run_until
from laneway.bench.harness.procs import Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.stream import StreamResult, client_session, stream_request
from laneway.routing.picker import PickingSettings
from laneway.simulator.metrics import BUSY_SECONDS
from laneway.simulator.prefix_experiment import (
    PickerName,
    PickerResult,
    PrefixScenario,
    picker_settings,
    pool_imbalance,
)
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import PUBLIC_MODEL
from laneway.tokens import default_tokenizer

DRAIN_S = 120.0  # model seconds in-flight requests get after the duration
ENGINE_COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    f"{BUSY_SECONDS}_total",
)


@dataclass
class _Tally:
    ttft_s: list[float] = field(default_factory=list)  # chat turns, model time
    first_document_s: float | None = None
    last_document_s: float = 0.0
    ok: int = 0
    failed: list[str] = field(default_factory=list)


class _Client:
    """Plays the scenario's sessions against the gateway in (scaled) real time."""

    def __init__(self, scenario: PrefixScenario, gateway_url: str, time_scale: float) -> None:
        self.scenario, self.url, self.time_scale = scenario, gateway_url, time_scale
        self.prompts = PromptFactory(default_tokenizer())
        self.systems = [
            self.prompts.text(
                random.Random(f"{scenario.seed}/system/{app}"), scenario.system_prompt_tokens
            )
            for app in range(scenario.apps)
        ]
        self.tally = _Tally()
        self._keys = itertools.count()
        self._start = 0.0

    def now(self) -> float:
        """Model seconds since the run began."""
        return (time.perf_counter() - self._start) * self.time_scale

    async def _sleep(self, model_s: float) -> None:
        await asyncio.sleep(model_s / self.time_scale)

    async def run(self) -> None:
        scenario = self.scenario
        async with client_session() as http:
            self._start = time.perf_counter()
            slots = [self._slot(http, "chat") for _ in range(scenario.chat_sessions)] + [
                self._slot(http, "document") for _ in range(scenario.document_sessions)
            ]
            await run_until((scenario.duration_s + DRAIN_S) / self.time_scale, slots)

    async def _slot(self, http: aiohttp.ClientSession, kind: str) -> None:
        """One concurrent session after another, as the virtual run replaces finished ones."""
        first = True  # the first session starts within the first 2 s, the next at once
        while self.now() < self.scenario.duration_s:
            key = next(self._keys)
            rng = random.Random(f"{self.scenario.seed}/session/{key}")
            if kind == "chat":
                await self._chat(http, key, rng, first)
            else:
                await self._document(http, key, rng, first)
            first = False

    async def _chat(
        self, http: aiohttp.ClientSession, key: int, rng: random.Random, first: bool
    ) -> None:
        scenario = self.scenario
        system = self.systems[rng.randrange(scenario.apps)]
        turns = rng.randint(*scenario.turns)
        if first:
            await self._sleep(rng.uniform(0, 2.0))
        messages: list[dict[str, str]] = [{"role": "system", "content": system}]
        for turn in range(turns):
            if self.now() >= scenario.duration_s:
                break
            text_rng = random.Random(f"{scenario.seed}/text/{key}/{turn}")
            content = self.prompts.text(text_rng, rng.randint(*scenario.message_tokens))
            output = rng.randint(*scenario.output_tokens)
            messages.append({"role": "user", "content": content})
            reply = await self._send(http, key, messages, output, lane=None)
            messages.append({"role": "assistant", "content": reply.text if reply else ""})
            await self._sleep(rng.uniform(*scenario.think_time_s))

    async def _document(
        self, http: aiohttp.ClientSession, key: int, rng: random.Random, first: bool
    ) -> None:
        scenario = self.scenario
        document = self.prompts.text(random.Random(f"{scenario.seed}/document/{key}"),
                                     scenario.document_tokens)  # fmt: skip
        if first:
            await self._sleep(rng.uniform(0, 2.0))
        for question in range(scenario.questions):
            if self.now() >= scenario.duration_s:
                break
            text_rng = random.Random(f"{scenario.seed}/text/{key}/{question}")
            content = self.prompts.text(text_rng, rng.randint(*scenario.question_tokens))
            output = rng.randint(*scenario.answer_tokens)
            if self.tally.first_document_s is None:
                self.tally.first_document_s = self.now()
            messages = [{"role": "user", "content": f"{document}\n\n{content}"}]
            if await self._send(http, key, messages, output, lane="batch"):
                self.tally.last_document_s = self.now()
            think = rng.uniform(*scenario.think_time_s)
            if question < scenario.questions - 1:  # the next document follows at once
                await self._sleep(think)

    async def _send(
        self,
        http: aiohttp.ClientSession,
        key: int,
        messages: Sequence[Mapping[str, str]],
        output: int,
        lane: str | None,
    ) -> StreamResult | None:
        headers = {"x-laneway-session": str(key)}
        if lane is not None:
            headers["x-laneway-lane"] = lane
        body = {"model": PUBLIC_MODEL, "messages": list(messages), "max_tokens": output,
                "stream": True}  # fmt: skip
        url = f"{self.url}/v1/chat/completions"
        try:
            reply = await stream_request(http, url, body, headers, keep_text=True)
        except aiohttp.ClientError as error:
            self.tally.failed.append(f"session {key}: {error}")
            return None
        if reply.error is not None:
            self.tally.failed.append(f"session {key}: HTTP {reply.status}: {reply.error}")
            return None
        self.tally.ok += 1
        if lane is None and reply.ttft_s is not None:
            self.tally.ttft_s.append(reply.ttft_s * self.time_scale)
        return reply


def gateway_documents(
    scenario: PrefixScenario, picking: PickingSettings, endpoints: Mapping[str, Sequence[str]]
) -> list[dict[str, Any]]:
    """The scenario's pools with their engines' URLs, and a GatewayConfig picking as told."""
    documents = [pool.document(endpoints[pool.name]) for pool in scenario.pools()]
    return [*documents, gateway_config("prefix", picking, max_body_bytes=16 * 1024 * 1024)]


async def run_live_picker(
    scenario: PrefixScenario,
    profile: Profile,
    picker: PickerName,
    picking: PickingSettings,
    time_scale: float,
) -> PickerResult:
    """Start the engines and the gateway for one picker, play the sessions, stop them all."""
    settings = picker_settings(picker, picking)
    pools = scenario.pools()
    async with Children() as children:
        cluster = await start_cluster(
            children,
            pools,
            profile,
            time_scale,
            lambda endpoints: gateway_documents(scenario, settings, endpoints),
        )
        before = await children.watch(engine_counters(cluster.engines, ENGINE_COUNTERS))
        client = _Client(scenario, cluster.gateway.url, time_scale)
        await children.watch(client.run())
        after = await children.watch(engine_counters(cluster.engines, ENGINE_COUNTERS))
    tally = client.tally
    if tally.failed:
        print(f"  {len(tally.failed)} requests failed, e.g. {tally.failed[0]}", file=sys.stderr)
    delta = [
        {name: a[name] - b[name] for name in ENGINE_COUNTERS}
        for a, b in zip(after, before, strict=True)
    ]
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    busy: dict[str, list[float]] = {pool.name: [] for pool in pools}
    for pool_name, d in zip(cluster.pools, delta, strict=True):
        busy[pool_name].append(d[f"{BUSY_SECONDS}_total"])
    first = tally.first_document_s
    return PickerResult(
        picker=picker,
        hit_rate=hits / queries if queries else 0.0,
        prefill_tokens=round(queries - hits),
        ttft_s=tuple(tally.ttft_s),
        batch_makespan_s=tally.last_document_s - first if first is not None else 0.0,
        pool_imbalance=pool_imbalance(busy),
        requests=tally.ok,
    )
