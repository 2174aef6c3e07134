"""Does the gateway's TTFT histogram tell the truth? Held against the client's own timing.

The gateway reports TTFT as a Prometheus histogram; the load generator times every stream's
first content token itself. A histogram only knows which bucket a value fell in, so its
percentiles are estimates (Prometheus' `histogram_quantile`: linear within the bucket). Two
comparisons separate what the gateway measured from what its buckets can resolve:

- the gateway's estimate against the client's values estimated from the same buckets: any
  difference is a difference in measurement (where the clock starts and stops);
- the client's exact percentiles beside them, to show what bucket resolution costs.

The mean needs no buckets: the histogram's sum over its count against the client's mean.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from laneway.stats import percentile
from laneway.tables import format_table

TTFT_FAMILY = "laneway_gateway_ttft_seconds"
SLO_FAMILY = "laneway_gateway_slo_ttft"
AGREEMENT = 0.10  # the bar: within 10 % at P50 and P99


@dataclass(frozen=True)
class Histogram:
    """One cumulative histogram: upper bounds (the last is +Inf) and counts at or under each."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    slo_met: float = 0.0  # streams whose first token came within the pool's SLO

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed since `earlier` (same buckets)."""
        if not earlier.cumulative:
            return self
        return Histogram(
            bounds=self.bounds,
            cumulative=tuple(
                a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True)
            ),
            sum=self.sum - earlier.sum,
            slo_met=self.slo_met - earlier.slo_met,
        )


def gateway_ttft(metrics_text: str) -> Histogram:
    """The gateway's TTFT histogram summed over every pool and lane, and its SLO counter."""
    buckets: dict[float, float] = {}
    total = met = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == f"{TTFT_FAMILY}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name == f"{TTFT_FAMILY}_sum":
                total += sample.value
            elif sample.name == f"{SLO_FAMILY}_total" and sample.labels.get("met") == "true":
                met += sample.value
    bounds = tuple(sorted(buckets))
    return Histogram(
        bounds=bounds, cumulative=tuple(buckets[b] for b in bounds), sum=total, slo_met=met
    )


def bucketed(values: Sequence[float], bounds: Sequence[float]) -> Histogram:
    """`values` counted into the cumulative buckets `bounds`, as the gateway would."""
    ordered = sorted(values)
    cumulative = tuple(float(bisect.bisect_right(ordered, bound)) for bound in bounds)
    return Histogram(bounds=tuple(bounds), cumulative=cumulative, sum=sum(values))


def histogram_quantile(q: float, histogram: Histogram) -> float:
    """Prometheus' estimate of the q-quantile (0-1): linear within the bucket it falls in."""
    count = histogram.count
    if count == 0:
        return math.nan
    rank = q * count
    index = bisect.bisect_left(histogram.cumulative, rank)
    if index >= len(histogram.bounds) - 1 and math.isinf(histogram.bounds[-1]):
        return histogram.bounds[-2]  # beyond the last finite bound: Prometheus answers it
    low = histogram.bounds[index - 1] if index > 0 else 0.0
    below = histogram.cumulative[index - 1] if index > 0 else 0.0
    inside = histogram.cumulative[index] - below
    high = histogram.bounds[index]
    return low + (high - low) * ((rank - below) / inside if inside else 1.0)


@dataclass(frozen=True)
class TtftAgreement:
    """Client and gateway TTFT of the same streams, in seconds of wall time."""

    streams: int
    gateway_streams: int
    client_exact: Mapping[str, float]  # p50, p99, mean
    client_bucketed: Mapping[str, float]
    gateway: Mapping[str, float]
    client_slo_met: int
    gateway_slo_met: int

    def difference(self, key: str) -> float:
        """Gateway against the client in the same buckets (the mean: against the exact one)."""
        reference = self.client_exact[key] if key == "mean" else self.client_bucketed[key]
        if reference == 0 or math.isnan(reference):
            return math.nan
        return (self.gateway[key] - reference) / reference

    @property
    def agrees(self) -> bool:
        return self.streams == self.gateway_streams and all(
            abs(self.difference(key)) <= AGREEMENT for key in ("p50", "p99")
        )


def agreement(
    client_ttft_s: Sequence[float], gateway: Histogram, slo_s: float
) -> TtftAgreement | None:
    if not client_ttft_s or gateway.count == 0:
        return None
    exact = {
        "p50": percentile(client_ttft_s, 50),
        "p99": percentile(client_ttft_s, 99),
        "mean": sum(client_ttft_s) / len(client_ttft_s),
    }
    client_in_buckets = bucketed(client_ttft_s, gateway.bounds)
    return TtftAgreement(
        streams=len(client_ttft_s),
        gateway_streams=round(gateway.count),
        client_exact=exact,
        client_bucketed={
            "p50": histogram_quantile(0.5, client_in_buckets),
            "p99": histogram_quantile(0.99, client_in_buckets),
        },
        gateway={
            "p50": histogram_quantile(0.5, gateway),
            "p99": histogram_quantile(0.99, gateway),
            "mean": gateway.sum / gateway.count,
        },
        client_slo_met=sum(1 for value in client_ttft_s if value <= slo_s),
        gateway_slo_met=round(gateway.slo_met),
    )


def agreement_table(check: TtftAgreement, slo_s: float) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None or math.isnan(value) else f"{value * 1000:,.1f}"

    def pct(value: float) -> str:
        return "-" if math.isnan(value) else f"{value * 100:+.1f} %"

    rows = [
        (
            key,
            ms(check.client_exact[key]),
            ms(check.client_bucketed.get(key)),
            ms(check.gateway[key]),
            pct(check.difference(key)),
        )
        for key in ("p50", "p99", "mean")
    ]
    header = ("TTFT (wall ms)", "client", "client, gateway's buckets", "gateway", "difference")
    verdict = "agree" if check.agrees else "DISAGREE"
    return [
        *format_table(header, rows),
        f"streams timed: client {check.streams}, gateway {check.gateway_streams}; "
        f"first token within {slo_s * 1000:g} ms: client {check.client_slo_met}, "
        f"gateway {check.gateway_slo_met}; gateway and client {verdict} "
        f"(within {AGREEMENT:.0%} at P50 and P99)",
    ]
