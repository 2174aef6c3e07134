"""`laneway bench chaos --flood --mode live`: one tenant floods at a multiple of its share
while another tenant's SLO is measured, through two gateway replicas sharing one
redis-server. The check, on real processes, of what `flood_virtual.py` judges on the cost
model, with the same scenario (`laneway.simulator.flood_experiment.FloodScenario`: the
sessions, the turns' prompt and output lengths, the think times, the flood's caps).

Two `laneway sim` engines behind one interactive pool, two gateway replicas with a keys file
of the steady tenant (no caps) and the flood tenants: `flood`, whose share is `flood_share`
requests running in the pool at once and `flood_queue` waiting (`maxConcurrentRequests`,
`maxQueuedRequests`, held over both replicas through Redis), and for each token cap in
`max_prompt_tokens` a `flood-<cap>` with those caps and `maxConcurrentPromptTokens: <cap>`.
The same steady clients run throughout (closed-loop chat sessions spread over both
replicas), and the run alternates `rounds` times through one segment of each kind, each
`duration_s / (kinds x rounds)` long:

1. `alone`: no flood tenant sends (the steady tenant's unloaded run); the first `warmup_s`
   of the run are not counted;
2. `1x`: `flood` sends at its share (`flood_share` closed-loop senders, no think time);
3. `<factor>x`: it sends at `flood_factor` times that, each refused request sent again after
   its Retry-After;
4. `<factor>x, cap <cap>`: the same flood from `flood-<cap>`, for each token cap;
5. with `control`, `<factor>x, refused`: the same flood from `flood-refused`, whose
   `tokensPerMinute` (1) is less than any of its requests, so the gateway refuses each one
   (429 `tokens_exceed_limit`) once it has parsed and counted it, before any engine work.
   Not a configuration to judge but the machine's share: what handling a flood's refused
   requests costs the steady tenant on CPUs the gateways, the engines and the clients
   share, which the cost model's engines do not have.

The flood's senders run in a process of their own, so that the client work of its refused
requests does not delay the event loop that times the steady tenant's first tokens. A
steady request counts in the segment it was sent in. Each kind's steady TTFT P99 is
divided by the alone segments' (the goal's unloaded run), by the 1x ones' and, for a token
cap, by the uncapped flood's, all within the run (alternating spreads a shared machine's
drift over every kind): pooled over the rounds, and each round's own ratio as a median and a
spread, which on a busy machine says how much of the pooled ratio is noise. While it runs, a
watcher reads the gateways' shared tenant counts from Redis (as a replica reads its peers')
and keeps each segment's peak of its flood tenant's running requests and running prompt
tokens. The goal: at `flood_factor`, the steady P99 at most `GOAL_RATIO` of alone (pooled),
uncapped or with any of the caps (not the control), and none of its requests refused.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from redis.asyncio import Redis

from laneway.bench.demo.run import DEMO_POOLS
from laneway.bench.harness.machine import machine_description
from laneway.bench.harness.procs import Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.redis_server import LocalRedis, free_port
from laneway.bench.harness.stream import stream_request
from laneway.gateway.state.redis_store import DEFAULT_PREFIX
from laneway.gateway.state.tenant_share import RedisTenantShare
from laneway.simulator.flood_experiment import FloodScenario
from laneway.simulator.profiles import DEFAULT_PROFILE
from laneway.simulator.seed import PUBLIC_MODEL
from laneway.stats import percentile
from laneway.tables import format_table
from laneway.tokens import default_tokenizer

WARMUP = "warm-up"
GOAL_RATIO = 1.10  # steady TTFT P99, the flood's segments over the alone ones
STEADY = "steady"
NAMESPACE = "demo"  # the chat pool's
WATCH_S = 0.05  # how often the watcher reads the tenant counts


def default_scenario() -> FloodScenario:
    # Not counted: the first requests meet cold engines and gateways (tokenizer, connections).
    return FloodScenario(duration_s=60.0, warmup_s=2.0)


@dataclass(frozen=True)
class FloodOptions:
    # duration_s: every segment together; seed: the senders' draws; flood_factor: the
    # flooded segments'.
    scenario: FloodScenario = field(default_factory=default_scenario)
    rounds: int = 3  # alone, 1x, flooded (uncapped, each cap), alone, ...
    max_prompt_tokens: tuple[int, ...] = ()  # the flood's token caps, each a segment
    control: bool = False  # a segment of the flood refused at the gateway (module docs)


@dataclass(frozen=True)
class Segment:
    """One kind of segment: the flood's senders in shares (0: none) and its token cap."""

    factor: float
    max_prompt_tokens: int | None = None
    refused: bool = False  # the control: every request of the flood refused at the gateway

    @property
    def tenant(self) -> str:
        if self.refused:
            return "flood-refused"
        return "flood" if self.max_prompt_tokens is None else f"flood-{self.max_prompt_tokens}"

    @property
    def label(self) -> str:
        if self.factor == 0:
            return "alone"
        if self.refused:
            return f"{self.factor:g}x, refused"
        cap = "" if self.max_prompt_tokens is None else f", cap {self.max_prompt_tokens:,}"
        return f"{self.factor:g}x{cap}"


def segments_of(options: FloodOptions) -> tuple[Segment, ...]:
    """One round's segments, in order."""
    factor = options.scenario.flood_factor
    capped = (Segment(factor, cap) for cap in options.max_prompt_tokens)
    control = (Segment(factor, refused=True),) if options.control else ()
    return tuple(dict.fromkeys((Segment(0.0), Segment(1.0), Segment(factor), *capped, *control)))


def api_key(tenant: str) -> str:
    return f"sk-{tenant}"


def tenants_file(options: FloodOptions) -> dict[str, Any]:
    """The keys file: the flood tenants' caps (the scenario's), the steady tenant's none."""
    entries: list[dict[str, Any]] = [{"name": STEADY, "apiKeys": [api_key(STEADY)]}]
    flooding = {s.tenant: s for s in segments_of(options) if s.factor}
    for tenant, segment in flooding.items():
        cap = segment.max_prompt_tokens
        caps = replace(options.scenario, flood_max_prompt_tokens=cap).caps
        entry: dict[str, Any] = {
            "name": tenant,
            "apiKeys": [api_key(tenant)],
            "maxConcurrentRequests": caps.max_running,
            "maxQueuedRequests": caps.max_waiting,
        }
        if caps.max_running_tokens is not None:
            entry["maxConcurrentPromptTokens"] = caps.max_running_tokens
        if segment.refused:
            entry["tokensPerMinute"] = 1  # less than any request: each one refused
        entries.append(entry)
    return {"tenants": entries}


@dataclass(frozen=True)
class Sent:
    tenant: str
    segment: str  # its kind's label (or warm-up)
    status: int
    ttft_s: float | None
    error_code: str | None
    round: int = 0  # which round of segments it was sent in


@dataclass(frozen=True)
class Peak:
    """A segment's flood tenant at its most, as the gateways' shared counts had it."""

    running: int = 0
    running_prompt_tokens: int = 0


Ratio = tuple[float, float | None, float | None, float | None]  # pooled; rounds' median, low, high


@dataclass(frozen=True)
class SegmentRow:
    segment: str
    flood_factor: float
    flood_max_prompt_tokens: int | None
    steady_ok: int
    steady_refused: int
    steady_ttft_p50_s: float | None
    steady_ttft_p99_s: float | None
    # The steady P99 over the alone segments', the 1x ones' and (a token cap's) the uncapped
    # flood's: pooled, then each round's own as median, lowest, highest; None: no requests.
    ratio_alone: Ratio | None
    ratio_share: Ratio | None
    ratio_uncapped: Ratio | None
    flood_ok: int
    flood_refused: int  # 429s, by its own caps
    flood_peak: Peak


@dataclass(frozen=True)
class FloodReport:
    command: str
    machine: str
    options: dict[str, Any]
    segments: tuple[SegmentRow, ...]
    goal_ratio: float | None  # the flooded segments' best pooled ratio to alone
    goal_segment: str | None  # whose it is
    goal_met: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _p99(sent: Sequence[Sent], segment: str) -> float | None:
    ttfts = [
        s.ttft_s
        for s in sent
        if s.segment == segment and s.tenant == STEADY and s.status == 200 and s.ttft_s is not None
    ]
    return percentile(ttfts, 99) if ttfts else None


def _ratio(sent: Sequence[Sent], segment: str, over: str) -> Ratio | None:
    """The steady P99 in `segment` over that in `over`: pooled, and each round's own."""

    def of(part: Sequence[Sent]) -> float | None:
        top, bottom = _p99(part, segment), _p99(part, over)
        return None if top is None or not bottom else top / bottom

    pooled = of(sent)
    if pooled is None:
        return None
    rounds = sorted({s.round for s in sent})
    ratios = sorted(r for n in rounds if (r := of([s for s in sent if s.round == n])) is not None)
    if not ratios:
        return (pooled, None, None, None)
    return (pooled, statistics.median(ratios), ratios[0], ratios[-1])


def summarize(
    sent: Sequence[Sent], segment: Segment, peaks: dict[str, Peak], *, factor: float
) -> SegmentRow:
    """One kind of segment's counts and the steady tenant's TTFT, against the others (pure)."""
    label = segment.label
    steady = [s for s in sent if s.segment == label and s.tenant == STEADY]
    flood = [s for s in sent if s.segment == label and s.tenant == segment.tenant]
    ttfts = [s.ttft_s for s in steady if s.status == 200 and s.ttft_s is not None]
    uncapped = Segment(factor).label
    return SegmentRow(
        segment=label,
        flood_factor=segment.factor,
        flood_max_prompt_tokens=segment.max_prompt_tokens,
        steady_ok=sum(1 for s in steady if s.status == 200),
        steady_refused=sum(1 for s in steady if s.status != 200),
        steady_ttft_p50_s=percentile(ttfts, 50) if ttfts else None,
        steady_ttft_p99_s=percentile(ttfts, 99) if ttfts else None,
        ratio_alone=_ratio(sent, label, Segment(0.0).label),
        ratio_share=_ratio(sent, label, Segment(1.0).label),
        ratio_uncapped=None if segment.max_prompt_tokens is None else _ratio(sent, label, uncapped),
        flood_ok=sum(1 for s in flood if s.status == 200) if segment.factor else 0,
        flood_refused=sum(1 for s in flood if s.status == 429) if segment.factor else 0,
        flood_peak=peaks.get(label, Peak()),
    )


def report_of(
    command: str, options: FloodOptions, sent: Sequence[Sent], peaks: dict[str, Peak]
) -> FloodReport:
    factor = options.scenario.flood_factor
    segments = segments_of(options)
    rows = tuple(summarize(sent, s, peaks, factor=factor) for s in segments)
    flooded = [
        (row.ratio_alone[0], row.segment)
        for segment, row in zip(segments, rows, strict=True)
        if row.flood_factor == factor and row.ratio_alone is not None and not segment.refused
    ]
    best = min(flooded) if flooded else None
    refused = sum(row.steady_refused for row in rows)
    return FloodReport(
        command=command,
        machine=machine_description(),
        options=asdict(options),
        segments=rows,
        goal_ratio=None if best is None else best[0],
        goal_segment=None if best is None else best[1],
        goal_met=best is not None and best[0] <= GOAL_RATIO and refused == 0,
    )


def render(report: FloodReport) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:,.0f} ms"

    def ratio(value: Ratio | None) -> str:
        if value is None:
            return "-"
        pooled, median, low, high = value
        rounds = "" if median is None else f" ({median:.2f}; {low:.2f}-{high:.2f})"
        return f"{pooled:.2f}{rounds}"

    header = (
        "segments",
        "steady ok",
        "steady refused",
        "steady TTFT p50",
        "steady TTFT p99",
        "p99 / alone",
        "p99 / 1x",
        "p99 / uncapped",
        "flood ok",
        "flood 429",
        "flood peak running",
        "flood peak prompt tokens",
    )
    rows = [
        (
            h.segment,
            str(h.steady_ok),
            str(h.steady_refused),
            ms(h.steady_ttft_p50_s),
            ms(h.steady_ttft_p99_s),
            ratio(h.ratio_alone),
            ratio(h.ratio_share),
            ratio(h.ratio_uncapped),
            str(h.flood_ok),
            str(h.flood_refused),
            str(h.flood_peak.running),
            f"{h.flood_peak.running_prompt_tokens:,}",
        )
        for h in report.segments
    ]
    goal = "-" if report.goal_ratio is None else f"{report.goal_ratio:.2f} ({report.goal_segment})"
    return [
        f"laneway bench chaos --flood: {report.command}",
        f"machine: {report.machine}",
        "ratios: pooled over the rounds (each round's own: median; lowest-highest)",
        "",
        *format_table(header, rows),
        "",
        f"steady TTFT p99 flooded over alone, pooled: {goal} (goal <= {GOAL_RATIO:.2f}, "
        "0 steady requests refused)",
        f"goal {'met' if report.goal_met else 'NOT met'}",
    ]


def _fresh(body: dict[str, Any], tag: str) -> dict[str, Any]:
    """`body` with `tag` opening its prompt: a sender's few bodies, sent again, would
    otherwise hit the engine's prefix cache and cost it almost no prefill (the virtual run's
    prompts share nothing)."""
    message = body["messages"][0]
    return {**body, "messages": [{**message, "content": f"{tag}: {message['content']}"}]}


class _Load:
    """The senders of one process, on the run's clock: `start`, a `time.monotonic()` reading,
    is the same moment in the steady sessions' process and the flood's."""

    def __init__(self, urls: list[str], options: FloodOptions, start: float) -> None:
        self._urls = urls
        self._options = options
        self._segments = segments_of(options)
        self._prompts = PromptFactory(default_tokenizer())
        self.start = start
        self.sent: list[Sent] = []
        self.peaks: dict[str, Peak] = {}

    def now(self) -> float:
        return time.monotonic() - self.start

    def segment_s(self) -> float:
        return self._options.scenario.duration_s / (len(self._segments) * self._options.rounds)

    def segment_end(self) -> float:
        """When the segment running now ends, in the run's time."""
        return (int(self.now() / self.segment_s()) + 1) * self.segment_s()

    def segment(self) -> tuple[Segment | None, int]:
        """The segment's kind now (None: warming up), and its round."""
        now = self.now()
        if now < self._options.scenario.warmup_s:
            return None, 0
        index = int(now / self.segment_s())
        return self._segments[index % len(self._segments)], index // len(self._segments)

    def _body(self, rng: random.Random, *, steady: bool) -> dict[str, Any]:
        prompt, output = self._options.scenario.turn(rng, steady=steady)
        return {
            "model": PUBLIC_MODEL,
            "messages": [{"role": "user", "content": self._prompts.chat_content(rng, prompt)}],
            "max_tokens": output,
            "stream": True,
        }

    async def session(
        self,
        http: aiohttp.ClientSession,
        tenant: str,
        index: int,
        *,
        only: Segment | None = None,  # a flood sender: sends only in segments of this kind
    ) -> None:
        scenario = self._options.scenario
        steady = only is None
        # The flood's senders draw alike whatever their tenant: capped and not, same prompts.
        rng = random.Random(f"{scenario.seed}/{STEADY if steady else 'flood'}/{index}")
        url = self._urls[index % len(self._urls)] + "/v1/chat/completions"
        headers = {"Authorization": f"Bearer {api_key(tenant)}"}
        # A few bodies made up front: a flooding sender is refused many times a second, and
        # making a prompt each time would spend the client's CPU, not the gateway's.
        bodies = [] if steady else [self._body(rng, steady=False) for _ in range(3)]
        turn = 0
        while self.now() < scenario.duration_s:
            segment, round_ = self.segment()
            if only is not None and segment != only:
                await asyncio.sleep(0.05)
                continue
            label = WARMUP if segment is None else segment.label
            if bodies:
                body = _fresh(bodies[turn % len(bodies)], f"{tenant} {index} {turn}")
            else:
                body = self._body(rng, steady=True)
            turn += 1
            sending = self._send(http, url, body, headers)
            if steady:
                status, ttft_s, error, retry_after_s = await sending
            else:
                # A flood sender's segment ends with its requests, waiting or running, so
                # that the next segment starts without them (the gateway drops a request
                # whose client went away).
                try:
                    status, ttft_s, error, retry_after_s = await asyncio.wait_for(
                        sending, timeout=max(self.segment_end() - self.now(), 0.0)
                    )
                except TimeoutError:
                    continue  # not counted
            self.sent.append(Sent(tenant, label, status, ttft_s, error, round_))
            if status == 429:
                await asyncio.sleep(retry_after_s)
            elif steady:
                await asyncio.sleep(scenario.think_s(rng))

    @staticmethod
    async def _send(
        http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[int, float | None, str | None, float]:
        """Status, TTFT, error code and Retry-After; status 0 where the request failed,
        counted as refused (the goal wants none of the steady tenant's)."""
        try:
            result = await stream_request(http, url, body, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as error:
            return 0, None, type(error).__name__, 0.0
        retry_after_s = float(result.headers.get("retry-after", "1"))
        return result.status, result.ttft_s, result.error_code, retry_after_s

    async def watch(self, share: RedisTenantShare, pool: str) -> None:
        """Each segment's peak of its flood tenant's running requests and prompt tokens over
        every replica, read as a replica reads its peers' (this one holds no share)."""
        keys = [(pool, s.tenant) for s in self._segments if s.factor]
        while self.now() < self._options.scenario.duration_s:
            segment, _ = self.segment()
            counts = await share.peers(keys)
            if segment is not None and segment.factor:
                count = counts.get((pool, segment.tenant))
                if count is not None:
                    peak = self.peaks.get(segment.label, Peak())
                    self.peaks[segment.label] = Peak(
                        running=max(peak.running, count.running),
                        running_prompt_tokens=max(peak.running_prompt_tokens, count.running_tokens),
                    )
            await asyncio.sleep(WATCH_S)


async def run_flood(options: FloodOptions, command: str, say: Callable[[str], None]) -> FloodReport:
    with tempfile.TemporaryDirectory(prefix="laneway-flood-") as folder:
        directory = Path(folder)
        server = LocalRedis()
        try:
            await asyncio.to_thread(server.start)
            async with Children() as children:
                urls = await _start(children, server, directory, options, say)
                sent, peaks = await _load(urls, server.url, options, say)
        finally:
            server.stop()
    return report_of(command, options, sent, peaks)


async def _start(
    children: Children,
    server: LocalRedis,
    directory: Path,
    options: FloodOptions,
    say: Callable[[str], None],
) -> list[str]:
    chat = DEMO_POOLS[0]
    engines = await asyncio.gather(
        *(
            children.start_laneway_async(
                "sim", chat.sim_args(DEFAULT_PROFILE, 1.0), name=f"engine chat-{i}"
            )
            for i in range(2)
        )
    )
    config = directory / "gateway.yaml"
    config.write_text(yaml.safe_dump_all([chat.document([e.url for e in engines], NAMESPACE)]))
    keys = directory / "tenants.yaml"
    keys.write_text(yaml.safe_dump(tenants_file(options)))
    flags = ["--config", str(config), "--host", "127.0.0.1", "--redis-url", server.url]
    flags += ["--tenants", str(keys)]
    gateways = await asyncio.gather(
        *(
            children.start_laneway_async(
                "gateway", [*flags, "--port", str(free_port())], name=f"gateway {r}"
            )
            for r in ("a", "b")
        )
    )
    say("2 engines, 2 gateway replicas and redis-server are up")
    return [g.url for g in gateways]


async def _load(
    urls: list[str], redis_url: str, options: FloodOptions, say: Callable[[str], None]
) -> tuple[list[Sent], dict[str, Peak]]:
    # The flood's senders run in a process of their own: on the steady sessions' event loop
    # the client work of its thousands of refused requests would delay the loop that times
    # the steady tenant's first tokens, a cost of the bench, not of the gateway.
    spawn = multiprocessing.get_context("spawn")
    results, sending = spawn.Pipe(duplex=False)
    start = time.monotonic()
    flood_process = spawn.Process(
        target=_flood_senders, args=(sending, urls, options, start), name="flood", daemon=True
    )
    flood_process.start()
    sending.close()  # the child's end: once it exits, a read here ends too
    try:
        async with _client() as http:
            load = _Load(urls, options, start)
            steady = [load.session(http, STEADY, i) for i in range(options.scenario.sessions)]
            redis = Redis.from_url(redis_url)
            share = RedisTenantShare(redis, DEFAULT_PREFIX, replica="bench-watcher", lease_s=3.0)
            pool = f"{NAMESPACE}/{DEMO_POOLS[0].name}"
            kinds = ", ".join(s.label for s in segments_of(options))
            say(f"{options.rounds} rounds of {load.segment_s():g} s segments: {kinds}")
            try:
                _, flood_sent = await asyncio.gather(
                    asyncio.gather(load.watch(share, pool), *steady),
                    _received(results, flood_process),
                )
            finally:
                await redis.aclose()
            return [*load.sent, *flood_sent], load.peaks
    finally:
        # A run that fails or is interrupted stops its flood at once, not at its end.
        if flood_process.is_alive():
            flood_process.terminate()
        await asyncio.to_thread(flood_process.join)
        results.close()


async def _received(results: Connection, process: BaseProcess) -> list[Sent]:
    """What the flood's process sent, once it has sent it."""
    try:
        sent: list[Sent] = await asyncio.to_thread(results.recv)
    except EOFError:
        await asyncio.to_thread(process.join)
        raise RuntimeError(
            f"the flood's senders' process ended (exit code {process.exitcode}) without "
            "what it sent; its error is above"
        ) from None
    return sent


def _client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )


def _flood_senders(
    results: Connection, urls: list[str], options: FloodOptions, start: float
) -> None:
    """The flood's senders, in their own process: what they sent goes back on `results`."""

    async def send() -> list[Sent]:
        async with _client() as http:
            load = _Load(urls, options, start)
            # Each flooded kind has senders of its own, sending only in its segments: at its
            # share the flood keeps flood_share requests always running, as it does at its
            # cap, so what a flood adds over 1x is its refused and waiting requests.
            await asyncio.gather(
                *(
                    load.session(http, segment.tenant, i, only=segment)
                    for segment in segments_of(options)
                    for i in range(round(segment.factor * options.scenario.flood_share))
                )
            )
            return load.sent

    results.send(asyncio.run(send()))


def stderr_say(message: str) -> None:
    print(f"chaos --flood: {message}", file=sys.stderr, flush=True)
