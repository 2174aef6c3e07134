"""The tables `laneway bench gateway` prints (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.bench.gateway.classify import STAGES
from laneway.bench.gateway.results import (
    OVERHEAD_METRIC,
    OWN_STAGES,
    OWN_TIME_GOAL_S,
    BenchReport,
    LevelResult,
)
from laneway.tables import format_table


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def render(report: BenchReport) -> list[str]:
    header = (
        "concurrency", "direct p50", "direct p99", "gateway p50", "gateway p99",
        "added p50", "added p99", "p99 ratio", "direct req/s", "gateway req/s",
        "req/s per gw core", "cores client/engine/gw", "in flight direct/gw", "errors",
    )  # fmt: skip
    rows = []
    for level in report.levels:
        direct, gateway = level.direct, level.gateway
        ratio = (
            f"{gateway.e2e.p99 / direct.e2e.p99:.2f}x"
            if gateway.e2e and direct.e2e and direct.e2e.p99 > 0
            else "-"
        )
        per_core = level.requests_per_core_s
        cores = "/".join(
            f"{gateway.cores_busy(cpu):.2f}"
            for cpu in (gateway.cpu.client, gateway.cpu.engine, gateway.cpu.gateway)
        )
        rows.append(
            (
                str(level.concurrency),
                _ms(direct.e2e.p50 if direct.e2e else None),
                _ms(direct.e2e.p99 if direct.e2e else None),
                _ms(gateway.e2e.p50 if gateway.e2e else None),
                _ms(gateway.e2e.p99 if gateway.e2e else None),
                _ms(level.added_p50_s),
                _ms(level.added_p99_s),
                ratio,
                f"{direct.requests_per_s:.0f}",
                f"{gateway.requests_per_s:.0f}",
                "-" if per_core is None else f"{per_core:.0f}",
                cores,
                f"{direct.in_flight:.1f}/{gateway.in_flight:.1f}",
                f"{direct.errors}/{gateway.errors}",
            )
        )
    classify = report.classification
    engines = "1 engine" if report.engines == 1 else f"{report.engines} engines"
    think = (
        f"think time exponential, mean {report.think_ms:g} ms"
        if report.think_ms > 0
        else "no think time"
    )
    lines = [
        f"gateway overhead, end-to-end latency of streamed requests in ms ({report.machine}; "
        f"load average {report.load_average:.2f} at the start; {report.placement}; "
        f"engine profile {report.engine_profile}; {engines}; {think}); "
        "concurrency: the clients; in flight: the mean of streams open at once, by Little's "
        "law (successful requests x mean e2e / wall s)",
        *format_table(header, rows),
        "",
        *render_own_time(report.levels),
        "",
        f"routing a {classify.prompt_tokens:,}-token prompt ({classify.prompt_bytes:,} bytes "
        f"of JSON body) in ms, {classify.repeats} times; stages are medians:",
        *format_table(
            ("path", "median", "p99", *STAGES, "pool"),
            [
                (
                    "bounds decide",
                    _ms(classify.bounds_decided_s.p50),
                    _ms(classify.bounds_decided_s.p99),
                    *(_ms(seconds) for _, seconds in classify.bounds_stages_s),
                    classify.bounds_pool,
                ),
                (
                    "exact count",
                    _ms(classify.exact_count_s.p50),
                    _ms(classify.exact_count_s.p99),
                    *(_ms(seconds) for _, seconds in classify.exact_stages_s),
                    classify.exact_pool,
                ),
            ],
        ),
        "",
        f"longest event-loop stall while the exact count ran off the loop, in ms, "
        f"{classify.repeats} times:",
        *format_table(
            ("count runs in", "median", "max"),
            [(stall.where, _ms(stall.p50_s), _ms(stall.max_s)) for stall in classify.loop_stalls],
        ),
    ]
    return lines


def render_own_time(levels: Sequence[LevelResult]) -> list[str]:
    """The gateway's own measure of its part, beside the client's difference of two paths."""
    header = (
        "concurrency", "stream p50", "stream p99", "request p50", "request p99",
        "chunk p50", "chunk p99", f"streams <= {OWN_TIME_GOAL_S * 1000:g} ms",
        "sends in 10 ms p50/p99 (Poisson p99)",
    )  # fmt: skip
    rows = []
    for level in levels:
        stream, request, chunk = (level.gateway.own_stage(stage) for stage in OWN_STAGES)
        clumps = level.gateway.clumps
        rows.append(
            (
                str(level.concurrency),
                *(
                    _ms(getattr(stage, field) if stage else None)
                    for stage in (stream, request, chunk)
                    for field in ("p50_s", "p99_s")
                ),
                "-" if stream is None else f"{stream.within_goal:.1%}",
                "-" if clumps is None else f"{clumps.p50}/{clumps.p99} ({clumps.poisson_p99})",
            )
        )
    return [
        "the gateway's own time per request in ms, as it measured it "
        f"({OVERHEAD_METRIC} on its /metrics, read before and after each round; percentiles "
        "from the buckets as Prometheus' histogram_quantile gives them). request: arrival to "
        "the engine; chunk: each relayed chunk, read to written; stream: request + the chunk "
        "with [DONE]. The client-side 'added' above is what a user measures, the difference of two "
        "paths, which the processes sharing a core also move; this is the gateway's part alone. "
        "sends in 10 ms: how many requests the load generator sent within 10 ms of each of its "
        "sends to the gateway, against independent sends at the same rate: requests sent "
        "together wait for each other on the gateway's core, whatever each costs:",
        *format_table(header, rows),
    ]
