"""The loop-only tallies expose what a prometheus_client Histogram and Counter would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from laneway.gateway.metrics import LATENCY_BUCKETS, TBT_BUCKETS, LoopHistogram, StreamGaps

# Gaps below, on and above bucket edges, and past the last one.
GAPS = (0.0, 0.0005, 0.001, 0.0011, 0.03, 0.0300001, 0.2, 4.9, 5.0, 7.5, 0.03, 0.001)
SLO_S = 0.03


def _exposed(registry: CollectorRegistry, prefixes: tuple[str, ...]) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return sorted(line for line in lines if line.startswith(prefixes) and "_created" not in line)


def test_gaps_expose_the_same_buckets_sum_count_and_slo_counts_as_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    gaps = StreamGaps()
    ours.register(gaps)
    histogram = Histogram(
        "laneway_gateway_tbt_seconds", "h", ("pool", "lane"), buckets=TBT_BUCKETS, registry=theirs
    )
    slo = Counter("laneway_gateway_slo_tbt", "c", ("pool", "lane", "met"), registry=theirs)
    for pool, lane in (("a", "interactive"), ("b", "batch")):
        for met in ("true", "false"):  # as the relay did: both children made at its start
            slo.labels(pool, lane, met)
    for pool, lane, gap in [("a", "interactive", g) for g in GAPS] + [("b", "batch", 0.05)]:
        gaps.labels(pool, lane).observe(gap, gap <= SLO_S)
        histogram.labels(pool, lane).observe(gap)
        slo.labels(pool, lane, "true" if gap <= SLO_S else "false").inc()
    # prometheus_client adds `_created` samples; the counts themselves must be identical.
    prefixes = ("laneway_gateway_tbt_seconds_", "laneway_gateway_slo_tbt_total")
    assert _exposed(ours, prefixes) == _exposed(theirs, prefixes)
    assert len(_exposed(ours, prefixes)) == 2 * (len(TBT_BUCKETS) + 3) + 4


def test_a_loop_histogram_exposes_what_a_prometheus_client_histogram_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    name, labels = "laneway_gateway_request_seconds", ("pool", "lane")
    loop = LoopHistogram(name, "h", labels, LATENCY_BUCKETS)
    ours.register(loop)
    histogram = Histogram(name, "h", labels, buckets=LATENCY_BUCKETS, registry=theirs)
    # Values below, on and above bucket edges (integers among them), past the last one.
    values = [("a", "interactive", v) for v in (0.0, 0.005, 0.0051, 1, 2.5, 120, 121.0)]
    for pool, lane, value in [*values, ("b", "batch", 0.3)]:
        loop.labels(pool, lane).observe(value)
        histogram.labels(pool, lane).observe(value)
    exposed = _exposed(ours, (f"{name}_",))
    assert exposed == _exposed(theirs, (f"{name}_",))
    assert len(exposed) == 2 * (len(LATENCY_BUCKETS) + 3)
