"""`laneway bench chaos --flood --mode live`: one tenant floods at a multiple of its share
while another tenant's SLO is measured, through two gateway replicas sharing one
redis-server. The check, on real processes, of what `flood_virtual.py` judges on the cost
model.

Two `laneway sim` engines behind one interactive pool, two gateway replicas with a keys file
of two tenants: `steady` (no caps) and `flood`, whose share is `flood_share` requests
running in the pool at once and `flood_queue` waiting (`maxConcurrentRequests`,
`maxQueuedRequests`, held over both replicas through Redis). The same steady clients run
throughout (closed-loop chat sessions spread over both replicas), and the run alternates
`rounds` times between two kinds of segment of `duration_s / (2 x rounds)` each:

1. `baseline`: the flood tenant sends at its share (`flood_share` closed-loop senders);
   the first `WARMUP_S` of the run are not counted;
2. `flood`: it sends at `flood_factor` times that, each refused request sent again after
   its Retry-After.

The goal compares the steady tenant's TTFT P99 over the flood segments with that over the
baseline ones of the same run (a ratio; alternating spreads a shared machine's drift over
both): at most `GOAL_RATIO`, and none of its requests refused. Each round's own ratio (its
flood segment over its baseline one) is reported too, as a median and a spread: on a busy
machine the spread says how much of the pooled ratio is noise.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from laneway.bench.demo.run import DEMO_POOLS
from laneway.bench.harness.machine import machine_description
from laneway.bench.harness.procs import Children
from laneway.bench.harness.prompts import PromptFactory
from laneway.bench.harness.redis_server import LocalRedis, free_port
from laneway.bench.harness.stream import stream_request
from laneway.simulator.profiles import DEFAULT_PROFILE
from laneway.simulator.seed import PUBLIC_MODEL
from laneway.stats import percentile
from laneway.tables import format_table
from laneway.tokens import default_tokenizer

WARMUP, BASELINE, FLOOD = "warm-up", "baseline", "flood"
# Not counted: the first requests meet cold engines and gateways (tokenizer, connections).
WARMUP_S = 2.0
GOAL_RATIO = 1.10  # steady TTFT P99, flood segments over baseline ones
KEYS = {"steady": "sk-steady", "flood": "sk-flood"}


def tenants_file(flood_share: int, flood_queue: int) -> dict[str, Any]:
    """The keys file: the flood tenant's caps, the steady tenant's none."""
    flood = {
        "name": "flood",
        "apiKeys": [KEYS["flood"]],
        "maxConcurrentRequests": flood_share,
        "maxQueuedRequests": flood_queue,
    }
    return {"tenants": [{"name": "steady", "apiKeys": [KEYS["steady"]]}, flood]}


@dataclass(frozen=True)
class FloodOptions:
    duration_s: float = 60.0  # both halves together
    sessions: int = 4  # the steady tenant's closed-loop chat sessions
    # The flood tenant's maxQueuedRequests: past it its senders are refused (429) and come
    # back after Retry-After; a line as long as the flood holds them waiting instead.
    flood_queue: int = 8
    flood_share: int = 4  # the flood tenant's maxConcurrentRequests in the pool
    flood_factor: int = 10  # the flood segments' senders, in shares
    rounds: int = 3  # baseline, flood, baseline, flood, ...
    seed: int = 0


@dataclass(frozen=True)
class Sent:
    tenant: str
    segment: str  # baseline or flood (or warm-up)
    status: int
    ttft_s: float | None
    error_code: str | None
    round: int = 0  # which (baseline, flood) pair it was sent in


@dataclass(frozen=True)
class SegmentRow:
    segment: str
    steady_ok: int
    steady_refused: int
    steady_ttft_p50_s: float | None
    steady_ttft_p99_s: float | None
    flood_ok: int
    flood_refused: int  # 429s, by its own caps


@dataclass(frozen=True)
class FloodReport:
    command: str
    machine: str
    options: dict[str, Any]
    segments: tuple[SegmentRow, ...]
    ttft_p99_ratio: float | None  # flood segments over baseline ones
    # Each round's flood segment over its baseline one: median, lowest, highest.
    round_ratios: tuple[float, ...]
    goal_met: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(sent: list[Sent], segment: str) -> SegmentRow:
    """One kind of segment's counts and the steady tenant's TTFT (pure)."""
    steady = [s for s in sent if s.segment == segment and s.tenant == "steady"]
    flood = [s for s in sent if s.segment == segment and s.tenant == "flood"]
    ttfts = [s.ttft_s for s in steady if s.status == 200 and s.ttft_s is not None]
    return SegmentRow(
        segment=segment,
        steady_ok=sum(1 for s in steady if s.status == 200),
        steady_refused=sum(1 for s in steady if s.status != 200),
        steady_ttft_p50_s=percentile(ttfts, 50) if ttfts else None,
        steady_ttft_p99_s=percentile(ttfts, 99) if ttfts else None,
        flood_ok=sum(1 for s in flood if s.status == 200),
        flood_refused=sum(1 for s in flood if s.status == 429),
    )


def _ratio(sent: list[Sent]) -> float | None:
    base, flood = summarize(sent, BASELINE), summarize(sent, FLOOD)
    if base.steady_ttft_p99_s and flood.steady_ttft_p99_s is not None:
        return flood.steady_ttft_p99_s / base.steady_ttft_p99_s
    return None


def report_of(command: str, options: FloodOptions, sent: list[Sent]) -> FloodReport:
    segments = (summarize(sent, BASELINE), summarize(sent, FLOOD))
    ratio = _ratio(sent)
    rounds = sorted({s.round for s in sent})
    per_round = [_ratio([s for s in sent if s.round == r]) for r in rounds]
    ratios = sorted(r for r in per_round if r is not None)
    refused = sum(h.steady_refused for h in segments)
    return FloodReport(
        command=command,
        machine=machine_description(),
        options=asdict(options),
        segments=segments,
        ttft_p99_ratio=ratio,
        round_ratios=(statistics.median(ratios), ratios[0], ratios[-1]) if ratios else (),
        goal_met=ratio is not None and ratio <= GOAL_RATIO and refused == 0,
    )


def render(report: FloodReport) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:,.0f} ms"

    header = (
        "segments",
        "steady ok",
        "steady refused",
        "steady TTFT p50",
        "steady TTFT p99",
        "flood ok",
        "flood 429",
    )
    rows = [
        (
            h.segment,
            str(h.steady_ok),
            str(h.steady_refused),
            ms(h.steady_ttft_p50_s),
            ms(h.steady_ttft_p99_s),
            str(h.flood_ok),
            str(h.flood_refused),
        )
        for h in report.segments
    ]
    ratio = "-" if report.ttft_p99_ratio is None else f"{report.ttft_p99_ratio:.2f}"
    rounds = "-"
    if report.round_ratios:
        median, low, high = report.round_ratios
        rounds = f"{median:.2f} ({low:.2f}-{high:.2f})"
    return [
        f"laneway bench chaos --flood: {report.command}",
        f"machine: {report.machine}",
        "",
        *format_table(header, rows),
        "",
        f"steady TTFT p99, flood segments / baseline ones: {ratio} (goal <= {GOAL_RATIO:.2f}, "
        "0 steady requests refused)",
        f"each round's own ratio, median (lowest-highest): {rounds}",
        f"goal {'met' if report.goal_met else 'NOT met'}",
    ]


class _Load:
    def __init__(self, urls: list[str], options: FloodOptions) -> None:
        self._urls = urls
        self._options = options
        self._prompts = PromptFactory(default_tokenizer())
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self.sent: list[Sent] = []

    def now(self) -> float:
        return self._loop.time() - self._start

    def segment(self) -> tuple[str, int]:
        """The segment's kind now, and its round."""
        now = self.now()
        segment = int(now / (self._options.duration_s / (2 * self._options.rounds)))
        if now < WARMUP_S:
            return WARMUP, 0
        return (FLOOD if segment % 2 else BASELINE), segment // 2

    def _body(self, rng: random.Random) -> dict[str, Any]:
        content = self._prompts.chat_content(rng, rng.randint(200, 800))
        return {
            "model": PUBLIC_MODEL,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": rng.randint(32, 128),
            "stream": True,
        }

    async def session(
        self,
        http: aiohttp.ClientSession,
        tenant: str,
        index: int,
        until: float,
        *,
        think: bool,
        only: str | None = None,  # send only in segments of this kind
    ) -> None:
        rng = random.Random(f"{self._options.seed}/{tenant}/{index}")
        url = self._urls[index % len(self._urls)] + "/v1/chat/completions"
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
        # A few bodies made up front: a flooding sender is refused many times a second, and
        # making a prompt each time would spend the client's CPU, not the gateway's.
        bodies = [] if think else [self._body(rng) for _ in range(3)]
        turn = 0
        while self.now() < until:
            segment, round_ = self.segment()
            if only is not None and segment != only:
                await asyncio.sleep(0.05)
                continue
            body = bodies[turn % len(bodies)] if bodies else self._body(rng)
            turn += 1
            try:
                result = await stream_request(http, url, body, headers=headers)
            except (aiohttp.ClientError, TimeoutError) as error:
                # Counted as refused: the goal wants none of the steady tenant's.
                self.sent.append(Sent(tenant, segment, 0, None, type(error).__name__, round_))
                continue
            self.sent.append(
                Sent(tenant, segment, result.status, result.ttft_s, result.error_code, round_)
            )
            if result.status == 429:
                await asyncio.sleep(float(result.headers.get("retry-after", "1")))
            elif think:
                await asyncio.sleep(rng.uniform(0.3, 0.8))


async def run_flood(options: FloodOptions, command: str, say: Any) -> FloodReport:
    with tempfile.TemporaryDirectory(prefix="laneway-flood-") as folder:
        directory = Path(folder)
        server = LocalRedis()
        try:
            await asyncio.to_thread(server.start)
            async with Children() as children:
                urls = await _start(children, server, directory, options, say)
                sent = await _load(urls, options, say)
        finally:
            server.stop()
    return report_of(command, options, sent)


async def _start(
    children: Children, server: LocalRedis, directory: Path, options: FloodOptions, say: Any
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
    config.write_text(yaml.safe_dump_all([chat.document([e.url for e in engines], "demo")]))
    keys = directory / "tenants.yaml"
    keys.write_text(yaml.safe_dump(tenants_file(options.flood_share, options.flood_queue)))
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


async def _load(urls: list[str], options: FloodOptions, say: Any) -> list[Sent]:
    segment_s = options.duration_s / (2 * options.rounds)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    ) as http:
        load = _Load(urls, options)
        end = options.duration_s
        steady = [load.session(http, "steady", i, end, think=True) for i in range(options.sessions)]
        # At its share the flood tenant keeps flood_share requests always running, as the
        # flood does at its cap: the engines carry the same load in both halves, and what
        # the flood adds is its refused and waiting requests.
        share_n = options.flood_share
        share = [load.session(http, "flood", i, end, think=False) for i in range(share_n)]
        extra = share_n * (options.flood_factor - 1)
        flood = [
            load.session(http, "flood", share_n + i, end, think=False, only=FLOOD)
            for i in range(extra)
        ]
        say(
            f"{options.rounds} x ({segment_s:g} s at its share, {segment_s:g} s at "
            f"{options.flood_factor}x) for the flood tenant"
        )
        await asyncio.gather(*steady, *share, *flood)
        return load.sent


def stderr_say(message: str) -> None:
    print(f"chaos --flood: {message}", file=sys.stderr, flush=True)
