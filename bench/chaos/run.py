"""`laneway bench chaos`: mixed load through two gateway replicas while faults strike.

Four `laneway sim` engines (the demo's pools: two chat, two documents), two `laneway gateway`
replicas sharing one redis-server (AOF, fsynced on every write), and three kinds of client
traffic for a bounded time: closed-loop chat streams (interactive lane), long documents
(batch lane) and one Batches API job (Files and Batches API, run by the replicas'
dispatchers). The run is cut into five windows; at the start of windows 2-4 one fault
strikes and is repaired `outage_s` later:

1. `engine`: the busiest engine (of one pool, with --kill-engine-in) is SIGKILLed, then
   restarted on its port;
2. `redis`: redis-server is SIGKILLed, then restarted from its AOF;
3. `gateway`: replica b is SIGKILLed, then restarted on its port.

Clients spread over both replicas, as a Service would spread them, and a request whose
replica refuses the connection goes to the other one (a load balancer's retry: a refused
connection never reached the process). A request in flight on a process when it was killed
fails; it is counted apart, as "in flight on the killed process". Every other failure is one
the system should not have had.

At the end: the batch's output and error files against its input (every custom_id exactly
once), what is still held (each replica's admitted and queued requests, in-flight prompt
tokens and running batch items; the shared endpoint load and pending batch entries in Redis;
the requests each engine is still running), and TTFT P50/P99 per window.

The pure part (the schedule, the classification of failures, the summary) is apart from the
shell that runs processes and clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from laneway.bench.demo.run import DEMO_POOLS, config_documents
from laneway.bench.gateway.run import machine_description
from laneway.bench.harness.loadgen import PromptFactory, StreamResult, stream_request
from laneway.bench.harness.procs import ChildProcess, Children
from laneway.bench.harness.redis_server import LocalRedis, free_port
from laneway.errors import ChildError, UsageError
from laneway.gateway.batch.files import as_text
from laneway.simulator.profiles import DEFAULT_PROFILE
from laneway.simulator.seed import PUBLIC_MODEL
from laneway.stats import percentile
from laneway.tables import format_table
from laneway.tokens import default_tokenizer

BEFORE, ENGINE, REDIS, GATEWAY, AFTER = "before", "engine", "redis", "gateway", "after"
WINDOWS = (BEFORE, ENGINE, REDIS, GATEWAY, AFTER)
FAULTS = (ENGINE, REDIS, GATEWAY)
CHAT, DOCUMENT = "chat", "document"
REPLICAS = ("a", "b")
KILLED_REPLICA = "b"

OK = "ok"
IN_FLIGHT = "in flight on killed"  # + the fault: "in flight on killed gateway"
UNEXPECTED = "unexpected"

# What the engine's death looks like to a stream it was serving: the gateway ends it with
# this error event (laneway.gateway.serving.proxy), or, before the first byte, answers 502.
ENGINE_GONE_CODES = ("upstream_failed", "upstream_unreachable")

# The default batch size: the batch must still be running when the last fault strikes, so
# that the killed replica is running items. 8 items at once (2 replicas x BATCH_CONCURRENCY),
# 256 output tokens each, go at about this rate on a small machine.
BATCH_ITEMS_PER_SECOND = 2.5
BATCH_CONCURRENCY = 4  # per replica

Say = Callable[[str], None]


@dataclass(frozen=True)
class ChaosOptions:
    duration_s: float = 60.0  # wall seconds of load; the faults strike within it
    sessions: int = 8  # closed-loop chat sessions
    documents: int = 2  # closed-loop long-document senders
    batch_items: int | None = None  # default: BATCH_ITEMS_PER_SECOND x duration
    outage_s: float = 3.0  # how long each killed process stays down
    engine_pool: str | None = None  # the pool whose busiest engine is killed; None: any
    batch_lease_s: float = 5.0  # the replicas' --batch-lease: reclaim after this silence
    settle_s: float = 180.0  # patience, after the load, for the batch and the held state
    seed: int = 0

    @property
    def items(self) -> int:
        if self.batch_items is not None:
            return self.batch_items
        return max(1, math.ceil(self.duration_s * BATCH_ITEMS_PER_SECOND))


QUICK = ChaosOptions(
    duration_s=20.0, sessions=3, documents=1, batch_items=30, outage_s=1.5, settle_s=90.0
)


def check_options(options: ChaosOptions) -> None:
    """UsageError naming the flag when the options cannot work."""
    window = options.duration_s / len(WINDOWS)
    if options.duration_s <= 0:
        raise UsageError(f"--duration must be above 0 seconds, got {options.duration_s:g}")
    if not 0 < options.outage_s < window:
        raise UsageError(
            f"--outage must be above 0 and shorter than one window ({window:g} s, a fifth "
            f"of --duration), got {options.outage_s:g}"
        )
    if options.sessions < 1 or options.documents < 0:
        raise UsageError("--sessions must be at least 1 and --documents at least 0")
    if options.items < 1:
        raise UsageError(f"--batch-items must be at least 1, got {options.items}")
    pools = [pool.name for pool in DEMO_POOLS]
    if options.engine_pool is not None and options.engine_pool not in pools:
        raise UsageError(f"--kill-engine-in must be one of {', '.join(pools)}")
    if options.batch_lease_s <= 0 or options.settle_s <= 0:
        raise UsageError("--batch-lease and --settle must be above 0 seconds")


# -- the schedule and the accounting (pure) -----------------------------------------------


def window_starts(duration_s: float) -> dict[str, float]:
    """Five equal windows; each fault strikes at the start of its own."""
    return {name: duration_s * index / len(WINDOWS) for index, name in enumerate(WINDOWS)}


def window_of(started_s: float, starts: Mapping[str, float]) -> str:
    current = BEFORE
    for name in WINDOWS:
        if started_s >= starts[name]:
            current = name
    return current


@dataclass(frozen=True)
class FaultEvent:
    fault: str  # ENGINE, REDIS or GATEWAY
    target: str  # which process: an engine ("documents-1"), "redis-server", a replica
    killed_at_s: float
    back_at_s: float  # when it was serving again
    pool: str | None = None  # a killed engine's pool


@dataclass(frozen=True)
class ChaosRecord:
    """One client request as the client saw it; seconds since the load began."""

    kind: str  # CHAT or DOCUMENT
    replica: str  # the replica that answered (or failed): "a" or "b"
    pool: str | None  # x-laneway-pool of the answer
    failed_over: bool  # the first replica refused the connection
    started_s: float
    ended_s: float
    status: int  # 0: no HTTP answer
    error: str | None
    error_code: str | None
    ttft_s: float | None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def failure_verdict(record: ChaosRecord, faults: Sequence[FaultEvent]) -> str:
    """OK, UNEXPECTED, or "in flight on killed engine|gateway": it was on that process
    when the process was killed."""
    if record.ok:
        return OK
    for fault in faults:
        spanned = record.started_s <= fault.killed_at_s <= record.ended_s
        if not spanned:
            continue
        if fault.fault == GATEWAY and record.replica == fault.target and record.status in (0, 200):
            # The connection dropped: no answer at all, or a stream cut before its end.
            return f"{IN_FLIGHT} {GATEWAY}"
        if (
            fault.fault == ENGINE
            and record.pool == fault.pool
            and record.error_code in ENGINE_GONE_CODES
        ):
            return f"{IN_FLIGHT} {ENGINE}"
    return UNEXPECTED


def failure_reason(record: ChaosRecord) -> str:
    if record.status == 0:
        return f"no answer: {record.error}"
    code = record.error_code or "-"
    return f"{record.status} {code}"


@dataclass(frozen=True)
class WindowRow:
    window: str
    sent: int
    ok: int
    in_flight_on_killed: int
    unexpected: int
    failed_over: int
    chat_ttft_p50_s: float | None
    chat_ttft_p99_s: float | None


@dataclass(frozen=True)
class FailureGroup:
    window: str
    kind: str
    verdict: str  # "in flight on killed engine|gateway" or UNEXPECTED
    reason: str
    count: int


def window_rows(
    records: Sequence[ChaosRecord], faults: Sequence[FaultEvent], starts: Mapping[str, float]
) -> tuple[WindowRow, ...]:
    rows = []
    for name in WINDOWS:
        mine = [r for r in records if window_of(r.started_s, starts) == name]
        verdicts = Counter(failure_verdict(r, faults) for r in mine)
        ttft = [r.ttft_s for r in mine if r.kind == CHAT and r.ok and r.ttft_s is not None]
        rows.append(
            WindowRow(
                window=name,
                sent=len(mine),
                ok=verdicts[OK],
                in_flight_on_killed=sum(n for v, n in verdicts.items() if v.startswith(IN_FLIGHT)),
                unexpected=verdicts[UNEXPECTED],
                failed_over=sum(r.failed_over for r in mine),
                chat_ttft_p50_s=percentile(ttft, 50) if ttft else None,
                chat_ttft_p99_s=percentile(ttft, 99) if ttft else None,
            )
        )
    return tuple(rows)


def failure_groups(
    records: Sequence[ChaosRecord], faults: Sequence[FaultEvent], starts: Mapping[str, float]
) -> tuple[FailureGroup, ...]:
    counts: Counter[tuple[str, str, str, str]] = Counter()
    for record in records:
        verdict = failure_verdict(record, faults)
        if verdict != OK:
            window = window_of(record.started_s, starts)
            counts[(window, record.kind, verdict, failure_reason(record))] += 1
    order = {name: index for index, name in enumerate(WINDOWS)}
    return tuple(
        FailureGroup(window=window, kind=kind, verdict=verdict, reason=reason, count=count)
        for (window, kind, verdict, reason), count in sorted(
            counts.items(), key=lambda item: (order[item[0][0]], item[0][1:])
        )
    )


@dataclass(frozen=True)
class BatchCheck:
    """The batch's output and error files against its input."""

    items: int
    status: str  # the batch's last status
    completed: int  # custom_ids in the output file
    failed: int  # custom_ids in the error file
    lost: int  # input custom_ids in neither file
    duplicated: int  # custom_ids written more than once, across both files
    unknown: int  # custom_ids in the files that the input never had
    errors: dict[str, int]  # error file: code -> count
    finished_at_s: float | None  # since the load began; None: not finished within --settle


def check_batch(
    expected: Sequence[str],
    output_ids: Sequence[str],
    error_ids: Sequence[str],
    error_codes: Sequence[str],
    status: str,
    finished_at_s: float | None,
) -> BatchCheck:
    seen = Counter([*output_ids, *error_ids])
    wanted = set(expected)
    return BatchCheck(
        items=len(expected),
        status=status,
        completed=len(output_ids),
        failed=len(error_ids),
        lost=sum(1 for custom_id in wanted if seen[custom_id] == 0),
        duplicated=sum(count - 1 for count in seen.values() if count > 1),
        unknown=sum(1 for custom_id in seen if custom_id not in wanted),
        errors=dict(Counter(error_codes)),
        finished_at_s=finished_at_s,
    )


def error_line_code(line: Mapping[str, Any]) -> str:
    """Why an error-file line failed: the item's error code (a line the gateway could not
    run), else the code of the error answer it got, else that answer's status."""
    error = line.get("error")
    if isinstance(error, Mapping) and error.get("code"):
        return str(error["code"])
    response = line.get("response")
    if not isinstance(response, Mapping):
        return "-"
    body = response.get("body")
    answer = body.get("error") if isinstance(body, Mapping) else None
    if isinstance(answer, Mapping) and answer.get("code"):
        return str(answer["code"])
    return str(response.get("status_code", "-"))


@dataclass(frozen=True)
class HeldAtEnd:
    """What is still held once the load and the batch are over: all zero when nothing leaks."""

    gateway: dict[str, dict[str, float]]  # replica -> gauge -> value
    shared: dict[str, bool]  # replica -> its state is shared through Redis again (redis_up)
    redis_load: dict[str, int]  # shared endpoint load fields that are not zero
    redis_pending: int  # batch entries claimed and never acknowledged
    engines: dict[str, int]  # engine -> requests running or waiting in it
    settled_after_s: float  # how long after the load it took to reach this

    @property
    def total(self) -> float:
        return (
            sum(sum(gauges.values()) for gauges in self.gateway.values())
            + sum(abs(value) for value in self.redis_load.values())
            + self.redis_pending
            + sum(self.engines.values())
        )


@dataclass(frozen=True)
class ChaosReport:
    command: str
    machine: str
    options: dict[str, Any]
    faults: tuple[FaultEvent, ...]
    windows: tuple[WindowRow, ...]
    failures: tuple[FailureGroup, ...]
    batch: BatchCheck
    held: HeldAtEnd
    goal_met: bool = field(init=False)

    def __post_init__(self) -> None:
        unexpected = sum(row.unexpected for row in self.windows)
        met = (
            unexpected == 0
            and self.batch.lost == 0
            and self.batch.duplicated == 0
            and self.batch.unknown == 0
            and self.batch.failed == 0
            and self.held.total == 0
            and all(self.held.shared.values())
        )
        object.__setattr__(self, "goal_met", met)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"


def render(report: ChaosReport) -> list[str]:
    lines = [f"laneway bench chaos: {report.command}", f"machine: {report.machine}", ""]
    lines.append("faults (seconds since the load began):")
    for fault in report.faults:
        lines.append(
            f"  {fault.fault:<8} {fault.target:<14} killed at {fault.killed_at_s:6.1f} s, "
            f"serving again at {fault.back_at_s:6.1f} s"
        )
    lines.append("")
    header = (
        "window",
        "sent",
        "ok",
        "in flight on killed",
        "unexpected",
        "failed over",
        "chat TTFT p50",
        "chat TTFT p99",
    )
    rows = [
        (
            row.window,
            str(row.sent),
            str(row.ok),
            str(row.in_flight_on_killed),
            str(row.unexpected),
            str(row.failed_over),
            _seconds(row.chat_ttft_p50_s),
            _seconds(row.chat_ttft_p99_s),
        )
        for row in report.windows
    ]
    lines += format_table(header, rows, rule=True)
    lines.append("")
    if report.failures:
        lines.append("failed requests, by window and why:")
        lines += [
            f"  {g.window:<8} {g.kind:<9} {g.verdict:<27} {g.count:>4} x {g.reason}"
            for g in report.failures
        ]
    else:
        lines.append("failed requests: none")
    batch = report.batch
    lines += [
        "",
        f"batch: {batch.items} items, {batch.status}"
        + (f" at {batch.finished_at_s:.1f} s" if batch.finished_at_s is not None else "")
        + f"; completed {batch.completed}, failed {batch.failed}, lost {batch.lost}, "
        f"done twice {batch.duplicated}, unknown {batch.unknown}",
    ]
    if batch.errors:
        lines.append("  error file: " + ", ".join(f"{c}: {n}" for c, n in batch.errors.items()))
    held = report.held
    gauges = "; ".join(
        f"{replica}: " + ", ".join(f"{name} {value:g}" for name, value in values.items())
        for replica, values in held.gateway.items()
    )
    lines += [
        "",
        f"held at the end ({held.settled_after_s:.1f} s after the load): {held.total:g}",
        f"  gateways: {gauges}",
        "  sharing state through Redis: "
        + ", ".join(f"{r} {'yes' if up else 'NO'}" for r, up in held.shared.items()),
        f"  redis: load fields not zero {len(held.redis_load)}, pending batch entries "
        f"{held.redis_pending}",
        "  engines running or waiting: "
        + ", ".join(f"{name} {count}" for name, count in held.engines.items()),
        "",
        "goal (0 lost, 0 done twice, 0 held, both replicas sharing state, no failure but in "
        "flight on a killed process): " + ("met" if report.goal_met else "NOT met"),
    ]
    return lines


# -- the shell: processes, clients, faults ------------------------------------------------


@dataclass
class _Fleet:
    children: Children
    redis: LocalRedis
    engines: dict[str, ChildProcess]  # name -> engine, e.g. "chat-0"
    engine_args: dict[str, list[str]]
    engine_pools: dict[str, str]  # engine name -> its pool's name
    gateways: dict[str, ChildProcess]  # replica -> process
    gateway_args: list[str]
    ports: dict[str, int]  # replica -> port
    urls: dict[str, str]  # replica -> base URL, stable across restarts


def _engine_args(args: Sequence[str], port: int) -> list[str]:
    """The pool's `laneway sim` flags with a fixed port, so a restart comes back on it."""
    fixed = list(args)
    fixed[fixed.index("--port") + 1] = str(port)
    return fixed


async def _start_fleet(
    children: Children, server: LocalRedis, directory: Path, options: ChaosOptions, say: Say
) -> _Fleet:
    engine_args: dict[str, list[str]] = {}
    engine_pools: dict[str, str] = {}
    for pool in DEMO_POOLS:
        for index in range(2):
            name = f"{pool.name}-{index}"
            engine_args[name] = _engine_args(pool.sim_args(DEFAULT_PROFILE, 1.0), free_port())
            engine_pools[name] = pool.name
    say(f"redis-server (AOF) is up; starting {len(engine_args)} engines and 2 gateway replicas")
    started = await asyncio.gather(
        *(
            children.start_laneway_async("sim", args, name=f"engine {name}")
            for name, args in engine_args.items()
        )
    )
    engines = dict(zip(engine_args, started, strict=True))
    endpoints = {
        pool.name: [engines[f"{pool.name}-{i}"].url for i in range(2)] for pool in DEMO_POOLS
    }
    config = directory / "gateway.yaml"
    config.write_text(yaml.safe_dump_all(config_documents(endpoints)))
    gateway_args = [
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--redis-url",
        server.url,
        "--batch-lease",
        f"{options.batch_lease_s:g}",
        "--batch-concurrency",
        str(BATCH_CONCURRENCY),
    ]
    ports = {replica: free_port() for replica in REPLICAS}
    gateways = dict(
        zip(
            REPLICAS,
            await asyncio.gather(
                *(
                    children.start_laneway_async(
                        "gateway",
                        [*gateway_args, "--port", str(ports[r])],
                        name=f"gateway {r}",
                    )
                    for r in REPLICAS
                )
            ),
            strict=True,
        )
    )
    urls = {replica: gateways[replica].url for replica in REPLICAS}
    return _Fleet(
        children=children,
        redis=server,
        engines=engines,
        engine_args=engine_args,
        engine_pools=engine_pools,
        gateways=gateways,
        gateway_args=gateway_args,
        ports=ports,
        urls=urls,
    )


async def _metric_samples(
    session: aiohttp.ClientSession, url: str
) -> list[tuple[str, dict[str, str], float]]:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as reply:
        text = await reply.text()
    return [
        (sample.name, sample.labels, float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def _sum_of(samples: Sequence[tuple[str, dict[str, str], float]], name: str) -> float:
    return sum(value for sample, _, value in samples if sample == name)


class _Clock:
    def __init__(self) -> None:
        self._start = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._start


class _Clients:
    """Chat sessions and document senders spread over both replicas, with failover."""

    def __init__(self, fleet: _Fleet, options: ChaosOptions, clock: _Clock) -> None:
        self._fleet = fleet
        self._options = options
        self._clock = clock
        self._prompts = PromptFactory(default_tokenizer())
        self.records: list[ChaosRecord] = []

    async def run(self, session: aiohttp.ClientSession) -> None:
        options = self._options
        workers = [self._chat(session, index) for index in range(options.sessions)]
        workers += [self._documents(session, index) for index in range(options.documents)]
        await asyncio.gather(*workers)

    async def _chat(self, session: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(f"{self._options.seed}/chat/{index}")
        await asyncio.sleep(rng.uniform(0, 1.0))
        while self._clock.now() < self._options.duration_s:
            body = {
                "model": PUBLIC_MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": self._prompts.chat_content(rng, rng.randint(200, 1500)),
                    }
                ],
                "max_tokens": rng.randint(50, 250),
                "stream": True,
            }
            await self._send(session, CHAT, index, "/v1/chat/completions", body)
            await asyncio.sleep(rng.uniform(0.5, 1.5))

    async def _documents(self, session: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(f"{self._options.seed}/document/{index}")
        await asyncio.sleep(rng.uniform(0, 2.0))
        while self._clock.now() < self._options.duration_s:
            prompt = await asyncio.to_thread(
                self._prompts.text, rng, rng.choice((16_384, 32_768, 49_152))
            )
            body = {
                "model": PUBLIC_MODEL,
                "prompt": prompt,
                "max_tokens": rng.randint(64, 128),
                "stream": True,
            }
            await self._send(session, DOCUMENT, index, "/v1/completions", body)
            await asyncio.sleep(rng.uniform(1.0, 3.0))

    async def _send(
        self,
        session: aiohttp.ClientSession,
        kind: str,
        index: int,
        path: str,
        body: Mapping[str, Any],
    ) -> None:
        home = REPLICAS[index % len(REPLICAS)]
        order = (home, *(r for r in REPLICAS if r != home))
        started = self._clock.now()
        failed_over = False
        for attempt, replica in enumerate(order):
            try:
                result = await stream_request(session, self._fleet.urls[replica] + path, body)
            except aiohttp.ClientConnectorError as error:
                # Refused: the request never reached a process, so another replica may take it.
                if attempt + 1 < len(order):
                    failed_over = True
                    continue
                self._failed(kind, replica, failed_over, started, f"refused: {error}")
                return
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                self._failed(kind, replica, failed_over, started, type(error).__name__)
                return
            self._record(kind, replica, failed_over, started, result)
            return

    def _record(
        self, kind: str, replica: str, failed_over: bool, started: float, result: StreamResult
    ) -> None:
        self.records.append(
            ChaosRecord(
                kind=kind,
                replica=replica,
                pool=result.headers.get("x-laneway-pool"),
                failed_over=failed_over,
                started_s=started,
                ended_s=self._clock.now(),
                status=result.status,
                error=result.error,
                error_code=result.error_code,
                ttft_s=result.ttft_s,
            )
        )

    def _failed(
        self, kind: str, replica: str, failed_over: bool, started: float, error: str
    ) -> None:
        self.records.append(
            ChaosRecord(
                kind=kind,
                replica=replica,
                pool=None,
                failed_over=failed_over,
                started_s=started,
                ended_s=self._clock.now(),
                status=0,
                error=error,
                error_code=None,
                ttft_s=None,
            )
        )


class _Batch:
    """One Batches API job: upload, create, poll, and check its files."""

    def __init__(self, fleet: _Fleet, options: ChaosOptions) -> None:
        self._fleet = fleet
        self._prompts = PromptFactory(default_tokenizer())
        self.custom_ids = [f"item-{i}" for i in range(options.items)]
        rng = random.Random(f"{options.seed}/batch")
        self._lines = [
            json.dumps(
                {
                    "custom_id": custom_id,
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": PUBLIC_MODEL,
                        "messages": [
                            {
                                "role": "user",
                                "content": self._prompts.chat_content(rng, rng.randint(200, 800)),
                            }
                        ],
                        "max_tokens": 256,
                    },
                }
            )
            for custom_id in self.custom_ids
        ]
        self.batch_id: str | None = None
        self.progress = "not created"
        self.record: dict[str, Any] = {}
        self.finished_at_s: float | None = None

    async def _call(
        self, session: aiohttp.ClientSession, method: str, path: str, **kwargs: Any
    ) -> tuple[int, bytes] | None:
        """(status, body) from the first replica that answers; None when neither does."""
        for replica in REPLICAS:
            try:
                async with session.request(
                    method,
                    self._fleet.urls[replica] + path,
                    timeout=aiohttp.ClientTimeout(total=30),
                    **kwargs,
                ) as reply:
                    return reply.status, await reply.read()
            except (aiohttp.ClientError, TimeoutError):
                continue
        return None

    async def _ok(
        self, session: aiohttp.ClientSession, what: str, method: str, path: str, **kwargs: Any
    ) -> bytes:
        """The body of a call that must succeed now; ChildError saying why it did not."""
        answer = await self._call(session, method, path, **kwargs)
        if answer is None:
            raise ChildError(f"no gateway replica answered while the bench {what}")
        status, body = answer
        if status != 200:
            text = body.decode("utf-8", "replace")[:300]
            raise ChildError(f"a gateway replica answered {status} when the bench {what}: {text}")
        return body

    async def create(self, session: aiohttp.ClientSession) -> None:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", "\n".join(self._lines).encode(), filename="chaos.jsonl")
        uploaded = json.loads(
            await self._ok(session, "uploaded the batch input", "POST", "/v1/files", data=form)
        )
        body = {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        created = json.loads(
            await self._ok(session, "created the batch", "POST", "/v1/batches", json=body)
        )
        self.batch_id = created["id"]
        self.record = created

    async def follow(
        self, session: aiohttp.ClientSession, stop: asyncio.Event, clock: _Clock
    ) -> None:
        """Poll until the batch finishes (or `stop`), keeping the last record seen."""
        while self.finished_at_s is None and not stop.is_set():
            # No answer or not 200 (a replica killed, Redis down): ask again in a second.
            answer = await self._call(session, "GET", f"/v1/batches/{self.batch_id}")
            if answer is not None and answer[0] == 200:
                record = json.loads(answer[1])
                self.record = record
                counts = record.get("request_counts") or {}
                self.progress = (
                    f"{record['status']} {counts.get('completed', 0)}+"
                    f"{counts.get('failed', 0)}/{counts.get('total', '?')}"
                )
                if record["status"] in ("completed", "failed", "expired", "cancelled"):
                    self.finished_at_s = clock.now()
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def check(self, session: aiohttp.ClientSession) -> BatchCheck:
        output = await self._lines_of(session, self.record.get("output_file_id"))
        errors = await self._lines_of(session, self.record.get("error_file_id"))
        return check_batch(
            self.custom_ids,
            [str(line.get("custom_id")) for line in output],
            [str(line.get("custom_id")) for line in errors],
            [error_line_code(line) for line in errors],
            str(self.record.get("status", "unknown")),
            self.finished_at_s,
        )

    async def _lines_of(
        self, session: aiohttp.ClientSession, file_id: str | None
    ) -> list[dict[str, Any]]:
        if not file_id:
            return []
        content = await self._ok(
            session, f"read the batch's file {file_id}", "GET", f"/v1/files/{file_id}/content"
        )
        return [json.loads(line) for line in content.decode().splitlines() if line.strip()]


async def _busiest_engine(fleet: _Fleet, session: aiohttp.ClientSession, pool: str | None) -> str:
    """The engine (of `pool`, or of any) running the most requests now: where a kill hurts
    most."""
    running = {}
    for name, engine in fleet.engines.items():
        if pool is not None and fleet.engine_pools[name] != pool:
            continue
        samples = await _metric_samples(session, engine.url)
        running[name] = _sum_of(samples, "vllm:num_requests_running")
    return max(running, key=lambda name: (running[name], name))


async def _inject(
    fleet: _Fleet,
    options: ChaosOptions,
    clock: _Clock,
    session: aiohttp.ClientSession,
    say: Say,
) -> list[FaultEvent]:
    starts = window_starts(options.duration_s)
    events: list[FaultEvent] = []
    for fault in FAULTS:
        await asyncio.sleep(max(0.0, starts[fault] - clock.now()))
        if fault == ENGINE:
            target = await _busiest_engine(fleet, session, options.engine_pool)
            fleet.engines[target].kill_now()
            killed = clock.now()
            say(f"{killed:6.1f} s  SIGKILL engine {target}")
            await asyncio.sleep(options.outage_s)
            fleet.engines[target] = await fleet.children.start_laneway_async(
                "sim", fleet.engine_args[target], name=f"engine {target} (restarted)"
            )
        elif fault == REDIS:
            target = "redis-server"
            await asyncio.to_thread(fleet.redis.kill)
            killed = clock.now()
            say(f"{killed:6.1f} s  SIGKILL redis-server")
            await asyncio.sleep(options.outage_s)
            await asyncio.to_thread(fleet.redis.start)
        else:
            target = KILLED_REPLICA
            fleet.gateways[target].kill_now()
            killed = clock.now()
            say(f"{killed:6.1f} s  SIGKILL gateway {target}")
            await asyncio.sleep(options.outage_s)
            fleet.gateways[target] = await fleet.children.start_laneway_async(
                "gateway",
                [*fleet.gateway_args, "--port", str(fleet.ports[target])],
                name=f"gateway {target} (restarted)",
            )
        back = clock.now()
        say(f"{back:6.1f} s  {target} serving again")
        events.append(
            FaultEvent(
                fault=fault,
                target=target,
                killed_at_s=killed,
                back_at_s=back,
                pool=fleet.engine_pools.get(target),
            )
        )
    return events


async def _held(fleet: _Fleet, session: aiohttp.ClientSession, since: float) -> HeldAtEnd:
    gauges = (
        "laneway_gateway_active_requests",
        "laneway_gateway_queue_depth",
        "laneway_gateway_in_flight_prompt_tokens",
        "laneway_gateway_batch_items_running",
    )
    gateway: dict[str, dict[str, float]] = {}
    shared: dict[str, bool] = {}
    for replica, child in fleet.gateways.items():
        samples = await _metric_samples(session, child.url)
        gateway[replica] = {
            name.removeprefix("laneway_gateway_"): _sum_of(samples, name) for name in gauges
        }
        shared[replica] = _sum_of(samples, "laneway_gateway_redis_up") == 1
    engines = {}
    for name, engine in fleet.engines.items():
        samples = await _metric_samples(session, engine.url)
        engines[name] = int(
            _sum_of(samples, "vllm:num_requests_running")
            + _sum_of(samples, "vllm:num_requests_waiting")
        )
    store = aioredis.Redis.from_url(fleet.redis.url)
    try:
        totals = await store.hgetall("laneway:load")
        load = {as_text(key): int(value) for key, value in totals.items() if int(value) != 0}
        pending = 0
        for tenant in await store.smembers("laneway:batch:queues"):
            for group in await store.xinfo_groups(f"laneway:batch:queue:{as_text(tenant)}"):
                pending += int(group["pending"])
    finally:
        await store.aclose()
    return HeldAtEnd(
        gateway=gateway,
        shared=shared,
        redis_load=load,
        redis_pending=pending,
        engines=engines,
        settled_after_s=time.monotonic() - since,
    )


async def _settle(
    fleet: _Fleet, session: aiohttp.ClientSession, patience_s: float, say: Say
) -> HeldAtEnd:
    """Read what is held until it is all released or patience runs out; the last reading."""
    since = time.monotonic()
    said = since
    while True:
        held = await _held(fleet, session, since)
        if (held.total == 0 and all(held.shared.values())) or held.settled_after_s > patience_s:
            return held
        if time.monotonic() - said >= 5.0:
            said = time.monotonic()
            say(f"{held.settled_after_s:5.1f} s after the load: {held.total:g} still held")
        await asyncio.sleep(1.0)


async def _progress(
    clients: _Clients, batch: _Batch, clock: _Clock, options: ChaosOptions, say: Say
) -> None:
    starts = window_starts(options.duration_s)
    while True:
        await asyncio.sleep(5.0)
        now = clock.now()
        failed = sum(1 for r in clients.records if not r.ok)
        say(
            f"{now:6.1f} s of {options.duration_s:g} s ({window_of(now, starts)} window): "
            f"{len(clients.records)} requests done, {failed} failed; batch {batch.progress}"
        )


async def run_bench(options: ChaosOptions, command: str, say: Say) -> ChaosReport:
    with tempfile.TemporaryDirectory(prefix="laneway-chaos-") as directory:
        server = LocalRedis(append_only_dir=Path(directory))
        try:
            await asyncio.to_thread(server.start)
            async with Children() as children:
                fleet = await _start_fleet(children, server, Path(directory), options, say)
                return await _run_load(fleet, options, command, say)
        finally:
            server.stop()


async def _run_load(fleet: _Fleet, options: ChaosOptions, command: str, say: Say) -> ChaosReport:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:
        batch = _Batch(fleet, options)
        await batch.create(session)
        say(f"batch {batch.batch_id}: {options.items} items; load for {options.duration_s:g} s")
        clock = _Clock()
        clients = _Clients(fleet, options, clock)
        stop_following = asyncio.Event()
        follower = asyncio.create_task(batch.follow(session, stop_following, clock))
        progress = asyncio.create_task(_progress(clients, batch, clock, options, say))
        try:
            load = asyncio.create_task(clients.run(session))
            faults = await _inject(fleet, options, clock, session, say)
            await load
            say(f"{clock.now():6.1f} s  load done; waiting for the batch")
            await asyncio.wait({follower}, timeout=options.settle_s)
        finally:
            stop_following.set()
            progress.cancel()
            await asyncio.gather(follower, progress, return_exceptions=True)
        batch_check = await batch.check(session)
        held = await _settle(fleet, session, options.settle_s, say)
    starts = window_starts(options.duration_s)
    records = clients.records
    return ChaosReport(
        command=command,
        machine=machine_description(),
        options={**asdict(options), "items": options.items},
        faults=tuple(faults),
        windows=window_rows(records, faults, starts),
        failures=failure_groups(records, faults, starts),
        batch=batch_check,
        held=held,
    )


def stderr_say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)
