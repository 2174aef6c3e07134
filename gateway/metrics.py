"""The gateway's Prometheus metrics, on a registry of their own per app (tests run several)."""

from __future__ import annotations

import bisect
import collections
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from laneway.ledger import Ledger

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
# About 1.3x apart up to 2 s, so a percentile estimated from the buckets lands near the
# true one where interactive SLOs live; the 300 ms default SLO is an edge.
TTFT_BUCKETS = (0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065,
                0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1, 1.25, 1.5,
                2, 3, 4, 6, 8, 15, 30, 60, 120)  # fmt: skip
TBT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5)
TOKEN_BUCKETS = tuple(float(2**n) for n in range(6, 18))  # 64 .. 131072
TOKENIZE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
# Fine below a few milliseconds, where the gateway's own time lives; 2 ms (issue 13's goal
# for a stream's added P99) is an edge, so the share within it is exact.
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003,
                    0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 2.5, 10)  # fmt: skip


class GatewayMetrics:
    def __init__(self, ledger: Ledger, clock: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        by_pool_lane = ("pool", "lane")
        self.requests = Counter(
            "laneway_gateway_requests",
            "Requests answered, by pool, lane and HTTP status (pool empty when not routed)",
            ("pool", "lane", "status"),
            registry=self.registry,
        )
        self.ttft = LoopHistogram(
            "laneway_gateway_ttft_seconds",
            "Time from the request's arrival to its first streamed event carrying output "
            "(text, a tool call, reasoning or logprobs)",
            by_pool_lane,
            buckets=TTFT_BUCKETS,
        )
        self.tbt = StreamGaps()
        self.registry.register(self.tbt)
        self.e2e = LoopHistogram(
            "laneway_gateway_request_seconds",
            "Time from the request's arrival to its last byte",
            by_pool_lane,
            buckets=LATENCY_BUCKETS,
        )
        self.prompt_tokens = LoopHistogram(
            "laneway_gateway_prompt_tokens",
            "Prompt tokens of routed requests",
            ("lane",),
            buckets=TOKEN_BUCKETS,
        )
        self.queue_wait = LoopHistogram(
            "laneway_gateway_queue_wait_seconds",
            "Time a request waited in the gateway's line for a slot in its pool",
            by_pool_lane,
            buckets=LATENCY_BUCKETS,
        )
        self.upstream_errors = Counter(
            "laneway_gateway_upstream_errors",
            "Failed upstream attempts, by pool, endpoint and kind",
            ("pool", "endpoint", "kind"),
            registry=self.registry,
        )
        self.tokenize = LoopHistogram(
            "laneway_gateway_tokenization_seconds",
            "Time to bound or count a request's prompt tokens, by method",
            ("method",),
            buckets=TOKENIZE_BUCKETS,
        )
        self.engine_counts = Counter(
            "laneway_gateway_engine_counts",
            "Exact prompt counts for pools whose tokenizer is the engine's: outcome engine "
            "(it answered), cached, or why it did not (timeout, unreachable, refused, failed, "
            "bad_answer, no_endpoint: then the gateway's default tokenizer counted)",
            ("pool", "outcome"),
            registry=self.registry,
        )
        self.ttft_slo = Counter(
            "laneway_gateway_slo_ttft",
            "Streamed requests (and batch-lane unstreamed ones, read as streams) whose first "
            "token came within the pool's slo.ttftMillis of their arrival (met=true) or not",
            ("pool", "lane", "met"),
            registry=self.registry,
        )
        self.reclaimed = Counter(
            "laneway_gateway_reclaimed_requests",
            "Borrowed (batch) requests ended on a replica its lending pool took back for "
            "chat, and requeued, by endpoint",
            ("endpoint",),
            registry=self.registry,
        )
        self.recomputed_prompt_tokens = Counter(
            "laneway_gateway_recomputed_prompt_tokens",
            "Prompt tokens that reclaimed requests' resends prefilled again, at most: each "
            "resend's prompt less what its engine reported cached (the gateway cannot see how "
            "far an ended attempt prefilled, so it takes the whole prompt), by pool",
            ("pool",),
            registry=self.registry,
        )
        self.reclaim = LoopHistogram(
            "laneway_gateway_reclaim_seconds",
            "Time from a lending pool's decision to take a lent replica back to the first chat "
            "token there, by pool",
            ("pool",),
            buckets=TTFT_BUCKETS,
        )
        self.overhead = GatewayOverhead()
        self.registry.register(self.overhead)
        histograms = (self.ttft, self.e2e, self.prompt_tokens, self.queue_wait, self.tokenize)
        for histogram in (*histograms, self.reclaim):
            self.registry.register(histogram)
        self.registry.register(_PoolStateCollector(ledger, clock))
        # `labels()` checks, formats and locks on every call (~2 us, six calls a request);
        # the request path looks its children up here instead, once per label set.
        self.requests_of = functools.cache(self.requests.labels)
        self.e2e_of = functools.cache(self.e2e.labels)
        self.prompt_tokens_of = functools.cache(self.prompt_tokens.labels)
        self.queue_wait_of = functools.cache(self.queue_wait.labels)
        self.tokenize_of = functools.cache(self.tokenize.labels)
        self.ttft_of = functools.cache(self.ttft.labels)
        self.ttft_slo_of = functools.cache(self.ttft_slo.labels)

    def reclaimed_on(self, url: str) -> None:
        self.reclaimed.labels(url).inc()


@dataclass
class Tally:
    """Histogram buckets and a sum, counted on the event loop."""

    bounds: tuple[float, ...]
    buckets: list[int] = field(init=False)
    total_s: float = 0.0

    def __post_init__(self) -> None:
        self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds


@dataclass
class GapTally:
    """One pool and lane's gaps between streamed chunks: their histogram and SLO counts."""

    gaps: Tally = field(default_factory=lambda: Tally(TBT_BUCKETS))
    slo_met: int = 0
    slo_missed: int = 0

    def observe(self, gap_s: float, within_slo: bool) -> None:
        self.gaps.observe(gap_s)
        if within_slo:
            self.slo_met += 1
        else:
            self.slo_missed += 1


class StreamGaps(Collector):
    """Time between streamed chunks (`laneway_gateway_tbt_seconds`) and whether each gap met
    the pool's slo.tbtMillis (`laneway_gateway_slo_tbt`).

    Observed once per relayed chunk, the stream's hottest metric: plain counts updated on the
    event loop, where every observation and every scrape runs, instead of a prometheus_client
    Histogram and Counter, whose locks guard against threads this loop never has and whose
    bucket walk runs in Python per chunk."""

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, str], GapTally] = {}

    def labels(self, pool: str, lane: str) -> GapTally:
        return self._tallies.setdefault((pool, lane), GapTally())

    def collect(self) -> Iterator[Metric]:
        gaps = HistogramMetricFamily(
            "laneway_gateway_tbt_seconds",
            "Time between two streamed chunks of one response",
            labels=["pool", "lane"],
        )
        slo = CounterMetricFamily(
            "laneway_gateway_slo_tbt",
            "Gaps between two streamed chunks within the pool's slo.tbtMillis (met=true) or not",
            labels=["pool", "lane", "met"],
        )
        for (pool, lane), tally in self._tallies.items():
            gaps.add_metric([pool, lane], _cumulative(tally.gaps), tally.gaps.total_s)
            slo.add_metric([pool, lane, "true"], tally.slo_met)
            slo.add_metric([pool, lane, "false"], tally.slo_missed)
        yield gaps
        yield slo


class LoopHistogram(Collector):
    """A histogram observed only on the event loop, exposed as prometheus_client's Histogram
    exposes one (less its `_created` samples): plain counts (`Tally`), where
    prometheus_client's `observe` takes a lock per bucket and per sum and walks the buckets in
    Python on every request, for threads that never observe it."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = list(labelnames)
        self._bounds = tuple(float(b) for b in buckets)
        self._tallies: dict[tuple[str, ...], Tally] = {}

    def labels(self, *values: str) -> Tally:
        tally = self._tallies.get(values)
        if tally is None:
            tally = self._tallies[values] = Tally(self._bounds)
        return tally

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, tally in self._tallies.items():
            family.add_metric(list(values), _cumulative(tally), tally.total_s)
        yield family


class GatewayOverhead(Collector):
    """The gateway's own time on the path of a request, as it measures it
    (`laneway_gateway_overhead_seconds`), by stage:

    - `request`: from the request's arrival to its bytes written to the engine, less its wait
      in the pool's line (`laneway_gateway_queue_wait_seconds`): reading, counting, routing,
      planning, and a failed first attempt where there was one;
    - `chunk`: each relayed chunk of a stream, from its bytes read from the engine to their
      write to the client, including any wait for the event loop (and a client that stops
      reading, once its buffers are full: it holds its own chunks);
    - `stream`: each stream that reached its `data: [DONE]`, its `request` plus the relay of
      the chunk that carried it: what the gateway added to the moment the client had the
      whole answer.

    Not in any stage: a wait for the loop before a request's first bytes are read, which
    the client's clock sees and the gateway's cannot."""

    def __init__(self) -> None:
        self.request = Tally(OVERHEAD_BUCKETS)
        self.chunk = Tally(OVERHEAD_BUCKETS)
        self.stream = Tally(OVERHEAD_BUCKETS)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "laneway_gateway_overhead_seconds",
            "The gateway's own time on a request's path, by stage: request (arrival to the "
            "engine, less the wait in line), chunk (each relayed chunk, read to written), "
            "stream (request plus the relay of the chunk carrying data: [DONE])",
            labels=["stage"],
        )
        for stage, tally in (
            ("request", self.request),
            ("chunk", self.chunk),
            ("stream", self.stream),
        ):
            family.add_metric([stage], _cumulative(tally), tally.total_s)
        yield family


def _cumulative(tally: Tally) -> list[tuple[str, float]]:
    """A tally's per-bucket counts as Prometheus' cumulative `le` buckets."""
    cumulative, running = [], 0
    for bound, count in zip((*tally.bounds, float("inf")), tally.buckets, strict=True):
        running += count
        cumulative.append((_bound_label(bound), float(running)))
    return cumulative


def _bound_label(bound: float) -> str:
    """A bucket's `le` as prometheus_client writes it (`0.005`, `1.0`, `+Inf`)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class _PoolStateCollector(Collector):
    """Queue depth, running requests, demand and endpoint health, read at scrape from the
    ledger."""

    def __init__(self, ledger: Ledger, clock: Callable[[], float]) -> None:
        self._ledger = ledger
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        waiting = GaugeMetricFamily(
            "laneway_gateway_queue_depth", "Requests waiting in the gateway's line", labels=["pool"]
        )
        active = GaugeMetricFamily(
            "laneway_gateway_active_requests", "Requests admitted and running", labels=["pool"]
        )
        endpoints = GaugeMetricFamily(
            "laneway_gateway_endpoints",
            "Endpoints by state (available or ejected)",
            labels=["pool", "state"],
        )
        engine_waiting = GaugeMetricFamily(
            "laneway_gateway_engine_waiting_requests",
            "Requests queued inside each engine, as last scraped (fresh samples only)",
            labels=["pool", "endpoint"],
        )
        engine_kv = GaugeMetricFamily(
            "laneway_gateway_engine_kv_usage",
            "KV cache usage of each engine, 0-1, as last scraped (fresh samples only)",
            labels=["pool", "endpoint"],
        )
        prefill_rate = GaugeMetricFamily(
            "laneway_gateway_endpoint_prefill_seconds_per_token",
            "Each endpoint's learned time to first token per prompt token of prefill backlog "
            "(the prior until streams have been observed), in seconds (Prometheus' base unit)",
            labels=["pool", "endpoint"],
        )
        queued_tokens = GaugeMetricFamily(
            "laneway_gateway_queued_prompt_tokens",
            "Prompt tokens of the requests waiting in the gateway's line (a pool at zero's "
            "backlog): what the operator scales batch pools on",
            labels=["pool"],
        )
        running_tokens = GaugeMetricFamily(
            "laneway_gateway_in_flight_prompt_tokens",
            "Prompt tokens of the admitted requests not yet finished",
            labels=["pool"],
        )
        ledger, now = self._ledger, self._clock()
        pools = ledger.pools()
        counts = ledger.demand(now)
        roles = GaugeMetricFamily(
            "laneway_gateway_lending_replicas",
            "A lending pool's replicas by role (serving, draining, lent, reclaiming)",
            labels=["pool", "role"],
        )
        index_blocks = GaugeMetricFamily(
            "laneway_gateway_prefix_index_blocks",
            "Prompt-prefix blocks the gateway's prefix index holds for each endpoint",
            labels=["pool", "endpoint"],
        )
        for pool in pools:
            queued_tokens.add_metric([pool.name], counts[pool.key].queued_prompt_tokens)
            running_tokens.add_metric([pool.name], counts[pool.key].in_flight_prompt_tokens)
            for role, count in collections.Counter(ledger.roles(pool).values()).items():
                roles.add_metric([pool.name, role.value], count)
            gate = ledger.gate(pool)
            waiting.add_metric([pool.name], gate.waiting)
            active.add_metric([pool.name], gate.active)
            available = len(ledger.available(pool))
            endpoints.add_metric([pool.name, "available"], available)
            endpoints.add_metric([pool.name, "ejected"], len(pool.endpoints) - available)
            for url in pool.endpoints:
                sample = ledger.fresh_metrics(url, now)
                if sample is not None:
                    engine_waiting.add_metric([pool.name, url], sample.waiting)
                    engine_kv.add_metric([pool.name, url], sample.kv_usage)
                rate = ledger.prefill_rate(url).ms_per_token
                prefill_rate.add_metric([pool.name, url], rate / 1000)
                index_blocks.add_metric([pool.name, url], ledger.prefix_index.blocks_of(url))
        yield from (waiting, active, endpoints, engine_waiting, engine_kv, prefill_rate)
        yield from (queued_tokens, running_tokens, index_blocks, roles)
