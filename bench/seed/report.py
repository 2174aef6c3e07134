"""Numbers people compare: per-configuration summaries, the table, and the JSON document."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneway.simulator.seed import SeedScenario
from laneway.simulator.seed_experiment import RunResult
from laneway.stats import percentile
from laneway.tables import format_table


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return {"p50": round(self.p50, 3), "p99": round(self.p99, 3), "max": round(self.max, 3)}


NO_SAMPLES = Percentiles(p50=math.nan, p99=math.nan, max=math.nan)


def percentiles_ms(seconds: Sequence[float]) -> Percentiles:
    if not seconds:
        return NO_SAMPLES
    ordered = sorted(seconds)
    return Percentiles(
        p50=percentile(ordered, 50) * 1e3, p99=percentile(ordered, 99) * 1e3, max=ordered[-1] * 1e3
    )


@dataclass(frozen=True)
class ConfigSummary:
    name: str
    description: str
    ttft_ms: Percentiles
    tbt_ms: Percentiles
    interactive_completed: int
    interactive_rejected: int
    batch_makespan_s: float  # burst arrival to the last batch completion
    batch_throughput_tok_s: float  # batch prompt + output tokens per makespan second
    batch_completed: int
    batch_submitted: int
    gpu_busy: float  # fraction of GPU-time with a step running, over the whole run
    # Share of interactive turns with TTFT and every gap within the SLO (rejected ones miss).
    slo_attainment: float = math.nan
    makespan_vs_unified_full: float = math.nan  # set by `against_unified_full`


def summarize(result: RunResult, scenario: SeedScenario) -> ConfigSummary:
    finished = result.batch_finished_at_s
    makespan = max(finished) - scenario.burst_at_s if finished else math.nan
    throughput = result.batch_tokens / makespan if finished and makespan > 0 else math.nan
    gpu_time = result.config.gpus * result.end_s
    turns = result.interactive_completed + result.interactive_rejected
    return ConfigSummary(
        name=result.config.name,
        description=result.config.summary,
        ttft_ms=percentiles_ms(result.ttft_s),
        tbt_ms=percentiles_ms(result.tbt_s),
        interactive_completed=result.interactive_completed,
        interactive_rejected=result.interactive_rejected,
        batch_makespan_s=makespan,
        batch_throughput_tok_s=throughput,
        batch_completed=len(finished),
        batch_submitted=result.batch_submitted,
        gpu_busy=result.gpu_busy_s / gpu_time if gpu_time > 0 else 0.0,
        slo_attainment=result.interactive_within_slo / turns if turns else math.nan,
    )


BASELINE = "unified-full"


def against_unified_full(summaries: Sequence[ConfigSummary]) -> list[ConfigSummary]:
    """The summaries with their batch makespan as a ratio to unified-full's in the same run."""
    base = next((s.batch_makespan_s for s in summaries if s.name == BASELINE), math.nan)
    return [
        dataclasses.replace(s, makespan_vs_unified_full=_divide(s.batch_makespan_s, base))
        for s in summaries
    ]


def _divide(value: float, baseline: float) -> float:
    if math.isnan(value) or math.isnan(baseline) or baseline == 0:
        return math.nan
    return value / baseline


def _number(value: float, digits: int = 3) -> float | None:
    """JSON has no NaN: a metric without samples is null."""
    return None if math.isnan(value) else round(value, digits)


def config_json(summary: ConfigSummary) -> dict[str, Any]:
    return {
        "description": summary.description,
        "interactive": {
            "ttft_ms": {k: _number(v) for k, v in summary.ttft_ms.as_dict().items()},
            "tbt_ms": {k: _number(v) for k, v in summary.tbt_ms.as_dict().items()},
            "completed": summary.interactive_completed,
            "rejected": summary.interactive_rejected,
            "slo_attainment": _number(summary.slo_attainment, 4),
        },
        "batch": {
            "makespan_s": _number(summary.batch_makespan_s),
            "throughput_tok_s": _number(summary.batch_throughput_tok_s),
            "completed": summary.batch_completed,
            "submitted": summary.batch_submitted,
            "makespan_vs_unified_full": _number(summary.makespan_vs_unified_full),
        },
        "gpu_busy": round(summary.gpu_busy, 4),
    }


def seed_json(
    scenario: SeedScenario,
    profile_name: str,
    summaries: Sequence[ConfigSummary],
    wall_s: float,
    mode: str = "virtual",
) -> dict[str, Any]:
    return {
        "scenario": "seed",
        "mode": mode,
        "seed": scenario.seed,
        "profile": profile_name,
        "parameters": {
            "gpus": scenario.gpus,
            "sessions": scenario.sessions,
            "long_requests": scenario.long_requests,
            "long_tokens": scenario.long_tokens,
            "long_output_tokens": scenario.long_output_tokens,
            "duration_s": scenario.duration_s,
            "burst_at_s": scenario.burst_at_s,
        },
        "wall_s": round(wall_s, 2),
        "configs": {summary.name: config_json(summary) for summary in summaries},
    }


COMPARED: tuple[tuple[str, str], ...] = (
    ("interactive TTFT P50 ms", "ttft_p50"),
    ("interactive TTFT P99 ms", "ttft_p99"),
    ("interactive TTFT max ms", "ttft_max"),
    ("interactive TBT P50 ms", "tbt_p50"),
    ("interactive TBT P99 ms", "tbt_p99"),
    ("interactive TBT max ms", "tbt_max"),
    ("interactive completed", "interactive_completed"),
    ("batch makespan s", "batch_makespan_s"),
    ("batch throughput tok/s", "batch_throughput_tok_s"),
    ("batch completed", "batch_completed"),
    ("GPU busy %", "gpu_busy_pct"),
)


def compared_values(summary: ConfigSummary) -> dict[str, float]:
    return {
        "ttft_p50": summary.ttft_ms.p50,
        "ttft_p99": summary.ttft_ms.p99,
        "ttft_max": summary.ttft_ms.max,
        "tbt_p50": summary.tbt_ms.p50,
        "tbt_p99": summary.tbt_ms.p99,
        "tbt_max": summary.tbt_ms.max,
        "interactive_completed": float(summary.interactive_completed),
        "batch_makespan_s": summary.batch_makespan_s,
        "batch_throughput_tok_s": summary.batch_throughput_tok_s,
        "batch_completed": float(summary.batch_completed),
        "gpu_busy_pct": summary.gpu_busy * 100,
    }


def difference_pct(live: float, virtual: float) -> float:
    if math.isnan(live) or math.isnan(virtual) or virtual == 0:
        return math.nan
    return (live - virtual) / virtual * 100


def comparison_table(virtual: ConfigSummary, live: ConfigSummary) -> str:
    """One configuration: each metric virtual, live, and live's difference in percent."""
    virtual_values, live_values = compared_values(virtual), compared_values(live)
    rows = []
    for label, key in COMPARED:
        digits = 0 if key.endswith(("completed", "tok_s")) else 1
        diff = difference_pct(live_values[key], virtual_values[key])
        rows.append(
            (
                label,
                _fmt(virtual_values[key], digits),
                _fmt(live_values[key], digits),
                "-" if math.isnan(diff) else f"{diff:+.0f}%",
            )
        )
    header = ("metric", "virtual", "live", "live vs virtual")
    table = format_table(header, rows, rule=True)
    return "\n".join([f"{virtual.name}: {virtual.description}", *table])


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def _share(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def _ratio(value: float, baseline: float) -> str:
    if math.isnan(value) or math.isnan(baseline) or baseline == 0:
        return "-"
    return f"{value / baseline:.2f}x"


def seed_table(summaries: Sequence[ConfigSummary]) -> str:
    """One column per configuration; the last rows compare each with the first (baseline)."""
    rows: list[tuple[str, list[str]]] = [
        ("interactive TTFT P50 ms", [_fmt(s.ttft_ms.p50) for s in summaries]),
        ("interactive TTFT P99 ms", [_fmt(s.ttft_ms.p99) for s in summaries]),
        ("interactive TTFT max ms", [_fmt(s.ttft_ms.max) for s in summaries]),
        ("interactive TBT P50 ms", [_fmt(s.tbt_ms.p50) for s in summaries]),
        ("interactive TBT P99 ms", [_fmt(s.tbt_ms.p99) for s in summaries]),
        ("interactive TBT max ms", [_fmt(s.tbt_ms.max) for s in summaries]),
        ("interactive completed", [str(s.interactive_completed) for s in summaries]),
        ("interactive within SLO", [_share(s.slo_attainment) for s in summaries]),
        ("batch makespan s", [_fmt(s.batch_makespan_s) for s in summaries]),
        ("batch throughput tok/s", [_fmt(s.batch_throughput_tok_s, 0) for s in summaries]),
        (
            "batch completed",
            [f"{s.batch_completed}/{s.batch_submitted}" for s in summaries],
        ),
        ("GPU busy", [f"{s.gpu_busy:.0%}" for s in summaries]),
    ]
    if summaries:
        base = summaries[0]
        rows += [
            (
                f"TTFT P99 vs {base.name}",
                [_ratio(s.ttft_ms.p99, base.ttft_ms.p99) for s in summaries],
            ),
            (f"TBT P99 vs {base.name}", [_ratio(s.tbt_ms.p99, base.tbt_ms.p99) for s in summaries]),
            (
                f"makespan vs {base.name}",
                [_ratio(s.batch_makespan_s, base.batch_makespan_s) for s in summaries],
            ),
        ]
    header = ["metric", *(s.name for s in summaries)]
    lines = format_table(header, [[label, *values] for label, values in rows], rule=True)
    lines.append("")
    lines += [f"{s.name}: {s.description}" for s in summaries]
    return "\n".join(lines)
