"""Holding the gateway's TTFT histogram against the client's timing
(laneway.bench.seed.ttft_check)."""

from __future__ import annotations

import math

import pytest

from laneway.bench.seed.ttft_check import (
    Histogram,
    agreement,
    bucketed,
    gateway_ttft,
    histogram_quantile,
)
from laneway.gateway.metrics import TTFT_BUCKETS

INF = math.inf
BOUNDS = (0.1, 0.2, 0.4, INF)

QUANTILES = [
    # (case, cumulative counts, q, expected), as Prometheus' histogram_quantile answers
    ("half way into the first bucket", (10, 10, 10, 10), 0.5, 0.05),
    ("linear inside the bucket it falls in", (0, 4, 8, 8), 0.75, 0.3),
    ("the top of a bucket", (0, 4, 8, 8), 0.5, 0.2),
    ("beyond the last finite bound: that bound", (0, 0, 1, 10), 0.99, 0.4),
    ("no observations", (0, 0, 0, 0), 0.5, math.nan),
]


@pytest.mark.parametrize(
    ("cumulative", "q", "expected"), [c[1:] for c in QUANTILES], ids=[c[0] for c in QUANTILES]
)
def test_histogram_quantile(cumulative: tuple[float, ...], q: float, expected: float) -> None:
    found = histogram_quantile(q, Histogram(BOUNDS, cumulative, 0.0))
    assert found == pytest.approx(expected, nan_ok=True)


def test_values_counted_into_buckets_include_the_bound() -> None:
    counted = bucketed([0.05, 0.1, 0.15, 5.0], BOUNDS)
    assert counted.cumulative == (2.0, 3.0, 3.0, 4.0)
    assert counted.sum == pytest.approx(5.3)


METRICS = """\
# TYPE laneway_gateway_ttft_seconds histogram
laneway_gateway_ttft_seconds_bucket{lane="interactive",le="0.1",pool="a"} 3.0
laneway_gateway_ttft_seconds_bucket{lane="interactive",le="+Inf",pool="a"} 4.0
laneway_gateway_ttft_seconds_count{lane="interactive",pool="a"} 4.0
laneway_gateway_ttft_seconds_sum{lane="interactive",pool="a"} 0.5
laneway_gateway_ttft_seconds_bucket{lane="batch",le="0.1",pool="b"} 0.0
laneway_gateway_ttft_seconds_bucket{lane="batch",le="+Inf",pool="b"} 1.0
laneway_gateway_ttft_seconds_count{lane="batch",pool="b"} 1.0
laneway_gateway_ttft_seconds_sum{lane="batch",pool="b"} 2.0
# TYPE laneway_gateway_slo_ttft counter
laneway_gateway_slo_ttft_total{lane="interactive",met="true",pool="a"} 3.0
laneway_gateway_slo_ttft_total{lane="interactive",met="false",pool="a"} 1.0
"""


def test_the_gateway_histogram_is_summed_over_pools_and_diffed_over_a_run() -> None:
    after = gateway_ttft(METRICS)
    assert after == Histogram((0.1, INF), (3.0, 5.0), 2.5, 3.0)
    before = Histogram((0.1, INF), (1.0, 1.0), 0.05, 1.0)
    assert after.minus(before) == Histogram((0.1, INF), (2.0, 4.0), 2.45, 2.0)


def test_a_gateway_that_timed_what_the_client_timed_agrees() -> None:
    client = [0.02 + 0.001 * i for i in range(200)]
    same = bucketed(client, (*TTFT_BUCKETS, INF))
    check = agreement(client, Histogram(same.bounds, same.cumulative, same.sum, 200), 0.3)
    assert check is not None
    assert check.agrees
    assert check.client_slo_met == check.gateway_slo_met == 200


def test_a_gateway_that_timed_an_earlier_event_disagrees() -> None:
    client = [0.02 + 0.001 * i for i in range(200)]
    early = [value - 0.015 for value in client]  # the role chunk, 15 ms before the token
    counted = bucketed(early, (*TTFT_BUCKETS, INF))
    check = agreement(client, counted, 0.3)
    assert check is not None
    assert not check.agrees
    assert check.difference("p50") < -0.10
    assert check.difference("mean") == pytest.approx(-0.015 / (sum(client) / len(client)))
