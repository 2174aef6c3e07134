"""`laneway bench day --mode live`: the day over HTTP, through the real gateway.

Per configuration: one `laneway sim` per replica with its pool's engine flags (time-scaled,
`harness/live_cluster.py`), the real `laneway gateway` configured with the configuration's
InferencePools (the lending fields included) and its lending timings in wall time, and the
day's clients (`DayLoad`): the very sessions and documents the virtual runner's
`DayWorkload` draws (same seed, same random streams), chat turns streamed and timed at the
client in model time, documents all at the start: whole (`stream: false`, as a Batches
API item is usually written, so a reclaimed one is resent unseen) or, with
`--stream-documents`, streamed (so the gateway sees each one's first token, which frees its
replica's prefill slot for the next: the per-replica feeding the virtual runner models; a
document streamed when chat takes its replica back after that first token ends with an
error). The run stops at the day's end, as the virtual one does: what finished by then
counts. While it runs, the gateway's `/metrics` are sampled for the lending pool's
replicas per role; at the end its reclaim histogram and its count of prompt tokens
prefilled twice are read, and the engines' busy seconds.
Every child is stopped when the configuration ends, however it ends (`harness/procs.py`).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from laneway.api import Lane
from laneway.bench.harness.live_cluster import (
    engine_counters,
    gateway_config,
    start_engines,
    start_gateway,
)
from laneway.bench.harness.loadgen import LoadGenerator, RequestRecord, run_until
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.stream import client_session, stream_request
from laneway.bench.harness.workload import INTERACTIVE, Workload, session_rng, text_rng
from laneway.bench.seed.live import lending_timings, warm_up
from laneway.simulator.day import SAMPLES, DayResult, DayScenario, RoleSample
from laneway.simulator.metrics import BUSY_SECONDS
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import (
    PUBLIC_MODEL,
    TBT_SLO_S,
    TTFT_SLO_S,
    ClusterConfig,
)

Say = Callable[[str], None]
PROGRESS_EVERY_S = 5.0  # wall seconds between progress lines
ROLES = "laneway_gateway_lending_replicas"
RECLAIM = "laneway_gateway_reclaim_seconds"
RECLAIMED = "laneway_gateway_reclaimed_requests_total"
RECOMPUTED = "laneway_gateway_recomputed_prompt_tokens_total"


@dataclass(frozen=True)
class DocumentRecord:
    """One document as the client saw it."""

    prompt_tokens: int
    status: int  # 0: no answer by the day's end (cut off) or no response at all
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def document_lengths(scenario: DayScenario) -> list[int]:
    """Each document's prompt tokens, drawn as `DayWorkload` draws them."""
    rng = random.Random(f"{scenario.seed}/documents")
    return [rng.randint(*scenario.document_tokens) for _ in range(scenario.documents)]


class DayLoad(LoadGenerator):
    """The day's clients: session `i` takes turns while the day's session count is above `i`
    (`DayScenario.sessions_at`), drawing its start, prompts, answers and think times from its
    own stream in `DayWorkload`'s order; the documents all go at the start."""

    def __init__(
        self, scenario: DayScenario, base_url: str, time_scale: float, *, stream_documents: bool
    ) -> None:
        chat = scenario.chat
        workload = Workload(
            model=PUBLIC_MODEL,
            sessions=scenario.peak_sessions,
            prompt_tokens=chat.prompt_tokens,
            output_tokens=chat.output_tokens,
            think_s=chat.think_time_s,
            ramp_s=chat.session_start_spread_s,
            duration_s=scenario.day_s,
            drain_s=0.0,  # the day ends at its end, as the virtual one does
            seed=scenario.seed,
        )
        super().__init__(workload, base_url, time_scale)
        self.scenario = scenario
        self.stream_documents = stream_documents
        self.documents: list[DocumentRecord] = []

    async def run(self) -> list[RequestRecord]:
        scenario = self.scenario
        lengths = document_lengths(scenario)
        prompts = [
            self.prompts.text(random.Random(f"{scenario.seed}/document-text/{i}"), tokens)
            for i, tokens in enumerate(lengths)
        ]
        async with client_session() as http:
            self._start = time.perf_counter()
            clients = [self._day_session(http, index) for index in range(scenario.peak_sessions)]
            clients += [
                self._document(http, prompt, tokens)
                for prompt, tokens in zip(prompts, lengths, strict=True)
            ]
            await run_until(scenario.day_s / self.time_scale, clients)
        return self.records

    async def _day_session(self, http: aiohttp.ClientSession, index: int) -> None:
        scenario, chat = self.scenario, self.scenario.chat
        rng = session_rng(scenario.seed, index)
        await self._sleep_model(rng.uniform(0, chat.session_start_spread_s))
        turns = 0
        while (now := self.elapsed_s()) < scenario.day_s:
            if index >= scenario.sessions_at(now):  # not active yet, or no longer
                await self._sleep_model(rng.uniform(*chat.think_time_s))
                continue
            prompt, output = rng.randint(*chat.prompt_tokens), rng.randint(*chat.output_tokens)
            turns += 1
            content = self.prompts.chat_content(text_rng(scenario.seed, index, turns), prompt)
            body = {
                "model": PUBLIC_MODEL,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": output,
                "stream": True,
            }
            tokens = self.prompts.chat_prompt_tokens(prompt)
            await self._issue(http, INTERACTIVE, index, self.workload.chat_path, body, tokens)
            await self._sleep_model(rng.uniform(*chat.think_time_s))

    async def _document(self, http: aiohttp.ClientSession, prompt: str, tokens: int) -> None:
        body = {
            "model": PUBLIC_MODEL,
            "prompt": prompt,
            "max_tokens": self.scenario.document_output_tokens,
            "stream": self.stream_documents,
        }
        url = self.base_url + self.workload.long_path
        try:
            if self.stream_documents:
                streamed = await stream_request(http, url, body)
                status, error = streamed.status, streamed.error
            else:
                async with http.post(url, json=body) as reply:
                    await reply.read()
                    status = reply.status
                    error = None if status == 200 else f"HTTP {status}"
        except asyncio.CancelledError:
            self.documents.append(DocumentRecord(tokens, 0, "cut off at the day's end"))
            raise
        except (aiohttp.ClientError, ValueError) as failure:
            self.documents.append(DocumentRecord(tokens, 0, type(failure).__name__))
        else:
            self.documents.append(DocumentRecord(tokens, status, error))


def day_gateway_documents(
    config: ClusterConfig, endpoints: Mapping[str, Sequence[str]], time_scale: float
) -> list[dict[str, Any]]:
    """The configuration's InferencePools and a GatewayConfig whose lending timings are the
    virtual runner's (`lending_timings`)."""
    documents = [pool.document(endpoints[pool.name], namespace="day") for pool in config.pools]
    gateway = gateway_config("day", config.picking)
    gateway["spec"]["lending"] = lending_timings(config, time_scale)
    return [*documents, gateway]


@dataclass(frozen=True)
class GatewayReading:
    """What the gateway's /metrics say about lending at one moment."""

    roles: Mapping[str, int]  # role -> the lending pool's replicas in it
    reclaims_s: tuple[tuple[float, int], ...]  # the reclaim histogram: (bucket bound, count)
    reclaimed_requests: int
    recomputed_tokens: int


def read_gateway(text: str) -> GatewayReading:
    roles: dict[str, int] = {}
    cumulative: list[tuple[float, int]] = []
    reclaimed = recomputed = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ROLES:
                role = sample.labels["role"]
                roles[role] = roles.get(role, 0) + int(sample.value)
            elif sample.name == f"{RECLAIM}_bucket":
                bound = float(sample.labels["le"])
                cumulative.append((bound, int(sample.value)))
            elif sample.name == RECLAIMED:
                reclaimed += sample.value
            elif sample.name == RECOMPUTED:
                recomputed += sample.value
    # One pool lends here; the buckets are cumulative, in order.
    buckets, below = [], 0
    for bound, count in sorted(cumulative):
        if count > below:
            buckets.append((bound, count - below))
        below = max(below, count)
    return GatewayReading(roles, tuple(buckets), int(reclaimed), int(recomputed))


async def _read_gateway(http: aiohttp.ClientSession, url: str) -> GatewayReading:
    async with http.get(f"{url}/metrics") as reply:
        return read_gateway(await reply.text())


def role_sample(config: ClusterConfig, at_s: float, roles: Mapping[str, int]) -> RoleSample:
    """Replicas per role as `simulator/day.py` samples them: a lent replica is batch's, a
    draining one neither lane's."""
    chat = sum(p.replicas for p in config.pools if p.lane is Lane.INTERACTIVE)
    batch = sum(p.replicas for p in config.pools if p.lane is Lane.BATCH)
    lent, draining = roles.get("lent", 0), roles.get("draining", 0)
    return RoleSample(at_s=at_s, chat=chat - lent - draining, batch=batch + lent, draining=draining)


@dataclass(frozen=True)
class LiveDay:
    result: DayResult
    turns_issued: int
    turns_accounted: int
    turns_failed: Mapping[str, int]  # why -> turns
    documents_failed: Mapping[str, int]  # why -> documents, cut off at the day's end included
    reclaimed_requests: int
    end_s: float  # model seconds the day ran


def day_result(
    config: ClusterConfig,
    turns: Sequence[RequestRecord],
    documents: Sequence[DocumentRecord],
    end: GatewayReading,
    roles: Sequence[RoleSample],
    busy_s: float,
    day_s: float,
    time_scale: float,
) -> DayResult:
    """The live day in the virtual runner's terms, so that one table and JSON serve both.

    Turns in SLO as the virtual runner judges them, at the client: a first token within
    TTFT and every gap within TBT. A turn cut off at the day's end is judged by neither
    side (the client has no timing of it). Document tokens prefilled: those of the documents
    completed (a document's partial prefill is not visible over HTTP). Reclaim latency from
    the gateway's histogram: each reclaim at its bucket's upper bound, in model time.
    """
    started = [t for t in turns if t.status != 400 and t.status != 429]
    completed = [t for t in turns if t.ok]
    in_slo = sum(
        t.ttft_s is not None and t.ttft_s <= TTFT_SLO_S and all(g <= TBT_SLO_S for g in t.gaps_s)
        for t in completed
    )
    done = [d for d in documents if d.ok]
    reclaim_ms = tuple(
        bound * time_scale * 1000
        for bound, count in end.reclaims_s
        for _ in range(count)
        if bound != float("inf")
    )
    return DayResult(
        config=config,
        turns_started=len(started),
        turns_completed=len(completed),
        turns_missed_unfinished=0,
        turns_in_slo=in_slo,
        ttft_s=tuple(t.ttft_s for t in completed if t.ttft_s is not None),
        tbt_s=tuple(gap for t in completed for gap in t.gaps_s),
        document_tokens_prefilled=sum(d.prompt_tokens for d in done),
        documents_completed=len(done),
        gpu_busy=min(1.0, busy_s / (config.gpus * day_s)) if day_s > 0 else 0.0,
        reclaim_ms=reclaim_ms,
        recomputed_tokens=end.recomputed_tokens,
        roles=tuple(roles),
    )


async def _sample_roles(
    http: aiohttp.ClientSession,
    url: str,
    config: ClusterConfig,
    load: DayLoad,
    scenario: DayScenario,
    samples: list[RoleSample],
) -> None:
    every_s = scenario.day_s / SAMPLES / load.time_scale
    while True:
        at = load.elapsed_s()
        reading = await _read_gateway(http, url)
        samples.append(role_sample(config, min(at, scenario.day_s), reading.roles))
        await asyncio.sleep(every_s)


async def _report_progress(load: DayLoad, scenario: DayScenario, say: Say) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY_S)
        turns = [r for r in load.records if r.kind == INTERACTIVE]
        docs = sum(d.ok for d in load.documents)
        say(
            f"{load.elapsed_s():5.1f} s of {scenario.day_s:g} s model time: "
            f"{scenario.sessions_at(load.elapsed_s())} sessions, {len(turns)} turns done, "
            f"{docs} of {scenario.documents} documents done"
        )


async def _busy(engines: Sequence[ChildProcess]) -> float:
    busy = f"{BUSY_SECONDS}_total"
    return sum(counters[busy] for counters in await engine_counters(engines, [busy]))


async def run_live_day(
    config: ClusterConfig,
    scenario: DayScenario,
    profile: Profile,
    time_scale: float,
    say: Say,
    *,
    stream_documents: bool,
) -> LiveDay:
    """Start the engines and the gateway for `config`, run the day, stop them all."""
    async with Children() as children:
        say(f"starting {config.gpus} engines and the gateway")
        engines = await start_engines(children, config.pools, profile, time_scale)
        documents = day_gateway_documents(config, engines.endpoints, time_scale)
        gateway = await start_gateway(children, documents)
        await children.watch(warm_up(gateway.url, config))
        busy_before = await children.watch(_busy(engines.engines))
        load = DayLoad(scenario, gateway.url, time_scale, stream_documents=stream_documents)
        samples: list[RoleSample] = []
        wall_s = scenario.day_s / time_scale
        say(f"the day begins: {scenario.day_s:g} s model time, {wall_s:g} s wall")
        async with client_session() as http:
            watchers = [
                asyncio.create_task(_report_progress(load, scenario, say)),
                asyncio.create_task(
                    _sample_roles(http, gateway.url, config, load, scenario, samples)
                ),
            ]
            try:
                await children.watch(load.run())
            finally:
                for watcher in watchers:
                    watcher.cancel()
                await asyncio.gather(*watchers, return_exceptions=True)
            end_s = load.elapsed_s()
            end = await children.watch(_read_gateway(http, gateway.url))
        busy = await children.watch(_busy(engines.engines)) - busy_before
        say(f"the day ended at {end_s:.1f} s model time; stopping")
    turns = [r for r in load.records if r.kind == INTERACTIVE]
    result = day_result(
        config, turns, load.documents, end, samples, busy, scenario.day_s, time_scale
    )
    return LiveDay(
        result=result,
        turns_issued=load.issued,
        turns_accounted=len(turns),
        turns_failed=_reasons(r.error or f"HTTP {r.status}" for r in turns if not r.ok),
        documents_failed=_reasons(d.error or "?" for d in load.documents if not d.ok),
        reclaimed_requests=end.reclaimed_requests,
        end_s=end_s,
    )


def _reasons(reasons: Iterable[str]) -> dict[str, int]:
    return dict(Counter(reasons))


def stderr_say(config_name: str) -> Say:
    def say(message: str) -> None:
        print(f"day live: {config_name:<12} {message}", file=sys.stderr, flush=True)

    return say
