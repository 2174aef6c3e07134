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
`laneway:engine_busy_seconds`), as deltas over the run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from laneway.api import API_VERSION
from laneway.bench.loadgen import PromptFactory
from laneway.bench.procs import ChildProcess, Children
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
from laneway.simulator.seed import PUBLIC_MODEL, SCRAPE_INTERVAL_S
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


@dataclass(frozen=True)
class _Reply:
    ttft_s: float | None  # wall seconds to the first content token
    text: str


async def _stream_chat(
    http: aiohttp.ClientSession, url: str, body: Mapping[str, Any], headers: Mapping[str, str]
) -> _Reply:
    """A streamed chat completion: when its first content came, and all of its text."""
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.read())[:200]!r}")
        async for raw in response.content:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(str(event["error"].get("message")))
            for choice in event.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    first = first if first is not None else time.perf_counter()
                    parts.append(content)
    return _Reply(None if first is None else first - started, "".join(parts))


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
        limit_s = (scenario.duration_s + DRAIN_S) / self.time_scale
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=timeout
        ) as http:
            self._start = time.perf_counter()
            slots = [self._slot(http, "chat") for _ in range(scenario.chat_sessions)] + [
                self._slot(http, "document") for _ in range(scenario.document_sessions)
            ]
            tasks = [asyncio.create_task(slot) for slot in slots]
            try:
                await asyncio.wait(tasks, timeout=limit_s)
            finally:
                for task in tasks:
                    task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result

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
    ) -> _Reply | None:
        headers = {"x-laneway-session": str(key)}
        if lane is not None:
            headers["x-laneway-lane"] = lane
        body = {"model": PUBLIC_MODEL, "messages": list(messages), "max_tokens": output,
                "stream": True}  # fmt: skip
        try:
            reply = await _stream_chat(http, self.url, body, headers)
        except (aiohttp.ClientError, RuntimeError) as error:
            self.tally.failed.append(f"session {key}: {error}")
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
    prefix = picking.prefix
    documents.append(
        {
            "apiVersion": API_VERSION,
            "kind": "GatewayConfig",
            "metadata": {"name": "prefix"},
            "spec": {
                "picking": {
                    "policy": picking.policy,
                    "weights": dict(picking.weights),
                    "prefix": {
                        "blockChars": prefix.block_chars,
                        "maxBlocks": prefix.max_blocks,
                        "capacityBlocks": prefix.capacity_blocks,
                    },
                },
                "scrape": {
                    "intervalMillis": round(SCRAPE_INTERVAL_S * 1000),
                    "staleAfterMillis": 2000,
                },
                "maxBodyBytes": 16 * 1024 * 1024,
                "queue": {"timeoutMillis": 600_000},
                "upstream": {"readTimeoutMillis": 600_000},
            },
        }
    )
    return documents


async def _counters(engines: Sequence[ChildProcess]) -> list[dict[str, float]]:
    async def one(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
        async with http.get(f"{url}/metrics") as response:
            text = await response.text()
        found = {name: 0.0 for name in ENGINE_COUNTERS}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in found:
                    found[sample.name] += sample.value
        return found

    async with aiohttp.ClientSession() as http:
        return list(await asyncio.gather(*(one(http, e.url) for e in engines)))


async def run_live_picker(
    scenario: PrefixScenario,
    profile: Profile,
    picker: PickerName,
    picking: PickingSettings,
    time_scale: float,
) -> PickerResult:
    """Start the engines and the gateway for one picker, play the sessions, stop them all."""
    settings = picker_settings(picker, picking)
    replicas = [(pool, index) for pool in scenario.pools() for index in range(pool.replicas)]
    async with Children() as children:
        engines = list(
            await asyncio.gather(
                *(
                    children.start_laneway_async(
                        "sim",
                        pool.sim_args(profile.name, time_scale),
                        name=f"engine {pool.name}-{i}",
                    )
                    for pool, i in replicas
                )
            )
        )
        endpoints: dict[str, list[str]] = {pool.name: [] for pool in scenario.pools()}
        for (pool, _), engine in zip(replicas, engines, strict=True):
            endpoints[pool.name].append(engine.url)
        with tempfile.TemporaryDirectory(prefix="laneway-prefix-") as directory:
            path = Path(directory) / "gateway.yaml"
            documents = gateway_documents(scenario, settings, endpoints)
            path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
            gateway = await children.start_laneway_async(
                "gateway", ["--config", str(path), "--host", "127.0.0.1", "--port", "0"]
            )
        before = await children.watch(_counters(engines))
        client = _Client(scenario, gateway.url, time_scale)
        await children.watch(client.run())
        after = await children.watch(_counters(engines))
    tally = client.tally
    if tally.failed:
        print(f"  {len(tally.failed)} requests failed, e.g. {tally.failed[0]}", file=sys.stderr)
    delta = [
        {name: a[name] - b[name] for name in ENGINE_COUNTERS}
        for a, b in zip(after, before, strict=True)
    ]
    queries = sum(d["vllm:prefix_cache_queries_total"] for d in delta)
    hits = sum(d["vllm:prefix_cache_hits_total"] for d in delta)
    busy: dict[str, list[float]] = {pool.name: [] for pool in scenario.pools()}
    for (pool, _), d in zip(replicas, delta, strict=True):
        busy[pool.name].append(d[f"{BUSY_SECONDS}_total"])
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
