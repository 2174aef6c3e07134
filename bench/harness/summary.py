"""Per-lane summaries of a run's records: percentiles of TTFT, TBT and end to end (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from laneway.bench.harness.loadgen import RequestRecord
from laneway.stats import percentile


@dataclass(frozen=True)
class Distribution:
    count: int
    p50: float
    p99: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> Distribution | None:
        if not values:
            return None
        return Distribution(
            count=len(values),
            p50=percentile(values, 50),
            p99=percentile(values, 99),
            max=max(values),
        )


@dataclass(frozen=True)
class LaneSummary:
    lane: str
    requests: int
    ok: int
    failed: int
    output_tokens: int
    ttft: Distribution | None
    tbt: Distribution | None  # over every gap of every request in the lane
    e2e: Distribution | None  # successful requests only
    pools: tuple[tuple[str, int], ...]  # (pool, requests), most used first
    errors: tuple[tuple[str, int], ...]  # (message, count), most common first


def summarize(records: Iterable[RequestRecord]) -> tuple[LaneSummary, ...]:
    """One summary per lane the requests went to, interactive first."""
    by_lane: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_lane.setdefault(record.effective_lane, []).append(record)
    order = {"interactive": 0, "batch": 1}
    return tuple(
        _summarize_lane(lane, by_lane[lane])
        for lane in sorted(by_lane, key=lambda lane: (order.get(lane, 2), lane))
    )


def _summarize_lane(lane: str, records: Sequence[RequestRecord]) -> LaneSummary:
    ok = [r for r in records if r.ok]
    pools = Counter(r.pool or "(engine)" for r in records if r.status != 0)
    errors = Counter(
        f"{r.status}: {r.error}" if r.status else str(r.error) for r in records if not r.ok
    )
    return LaneSummary(
        lane=lane,
        requests=len(records),
        ok=len(ok),
        failed=len(records) - len(ok),
        output_tokens=sum(r.output_tokens for r in records),
        ttft=Distribution.of([r.ttft_s for r in records if r.ttft_s is not None]),
        tbt=Distribution.of([gap for r in records for gap in r.gaps_s]),
        e2e=Distribution.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        pools=tuple(pools.most_common()),
        errors=tuple(errors.most_common()),
    )
