"""The live mode's shell: run each configuration live, then print it beside its virtual run."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from laneway.api import SLOSpec
from laneway.bench.harness.flags import write_results
from laneway.bench.harness.fronts import GATEWAY
from laneway.bench.harness.workload import INTERACTIVE
from laneway.bench.seed.live import LiveRun, run_live_config, stderr_say
from laneway.bench.seed.report import (
    ConfigSummary,
    against_unified_full,
    compared_values,
    comparison_table,
    config_json,
    difference_pct,
    seed_json,
    summarize,
)
from laneway.bench.seed.ttft_check import TtftAgreement, agreement, agreement_table
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import ClusterConfig, SeedScenario
from laneway.simulator.seed_experiment import RunResult
from laneway.tables import format_table


def lanes_of(run: LiveRun, kind: str) -> dict[str, int]:
    """How many requests of `kind` each lane answered (from x-laneway-lane)."""
    return dict(Counter(r.lane or "(none)" for r in run.records if r.kind == kind))


# The seed's pools keep the default SLO, which the gateway holds wall-clock TTFT against.
SLO_S = SLOSpec().ttft_millis / 1000


def ttft_agreement(run: LiveRun, time_scale: float) -> TtftAgreement | None:
    """Every stream's TTFT as the client timed it (wall time) against the gateway's."""
    client = [r.ttft_s / time_scale for r in run.records if r.ttft_s is not None]
    return agreement(client, run.gateway_ttft, SLO_S)


def _agreement_json(check: TtftAgreement | None) -> dict[str, Any] | None:
    if check is None:
        return None
    return {
        "streams": {"client": check.streams, "gateway": check.gateway_streams},
        "client_ms": {k: round(v * 1000, 2) for k, v in check.client_exact.items()},
        "client_in_gateway_buckets_ms": {
            k: round(v * 1000, 2) for k, v in check.client_bucketed.items()
        },
        "gateway_ms": {k: round(v * 1000, 2) for k, v in check.gateway.items()},
        "difference_pct": {k: round(check.difference(k) * 100, 1) for k in ("p50", "p99", "mean")},
        "slo_met": {"client": check.client_slo_met, "gateway": check.gateway_slo_met},
        "agrees": check.agrees,
    }


def live_config_json(summary: ConfigSummary, run: LiveRun, time_scale: float) -> dict[str, Any]:
    failed = Counter(r.error or f"HTTP {r.status}" for r in run.records if not r.ok)
    return {
        **config_json(summary),
        "gateway_ttft": _agreement_json(ttft_agreement(run, time_scale)),
        "requests": {
            "issued": run.issued,
            "accounted_for": len(run.records),
            "failed": dict(failed),
            "interactive_lanes": lanes_of(run, INTERACTIVE),
            "long_lanes": lanes_of(run, "long"),
        },
        "cpu": {
            "wall_s": round(run.cpu.wall_s, 2),
            "generator_cores": round(run.cpu.cores(run.cpu.generator_s), 3),
            "gateway_cores": round(run.cpu.cores(run.cpu.gateway_s), 3),
            "engines_cores": round(run.cpu.cores(run.cpu.engines_s), 3),
        },
    }


def _differences(virtual: ConfigSummary, live: ConfigSummary) -> dict[str, float | None]:
    live_values = compared_values(live)
    out: dict[str, float | None] = {}
    for key, value in compared_values(virtual).items():
        diff = difference_pct(live_values[key], value)
        out[key] = None if math.isnan(diff) else round(diff, 1)
    return out


async def _run_all(
    configs: Sequence[ClusterConfig],
    scenario: SeedScenario,
    profile: Profile,
    time_scale: float,
    fronts: Sequence[str],
) -> dict[str, list[LiveRun]]:
    """Every configuration through each front in turn, each on engines of its own."""
    runs: dict[str, list[LiveRun]] = {front: [] for front in fronts}
    for config in configs:
        for front in fronts:
            say = stderr_say(config.name if front == GATEWAY else f"{config.name} {front}")
            run = await run_live_config(config, scenario, profile, time_scale, say, front)
            runs[front].append(run)
    return runs


def fronts_compared(
    runs: Mapping[str, Sequence[LiveRun]], time_scale: float
) -> list[dict[str, Any]]:
    """Per configuration and front: the lanes each kind of request went to, the SLO
    verdicts (client-judged attainment, and laneway's own first-token verdicts against the
    client's), and whether laneway's TTFT agrees with the client's."""
    rows = []
    for front, front_runs in runs.items():
        for run in front_runs:
            check = ttft_agreement(run, time_scale)
            turns = run.result.interactive_completed + run.result.interactive_rejected
            rows.append(
                {
                    "config": run.result.config.name,
                    "front": front,
                    "interactive_lanes": lanes_of(run, INTERACTIVE),
                    "long_lanes": lanes_of(run, "long"),
                    "within_slo": f"{run.result.interactive_within_slo}/{turns}",
                    "ttft_slo_met": None
                    if check is None
                    else {"client": check.client_slo_met, "laneway": check.gateway_slo_met},
                    "ttft_difference_pct": None
                    if check is None
                    else {k: round(check.difference(k) * 100, 1) for k in ("p50", "p99", "mean")},
                    "ttft_agrees": None if check is None else check.agrees,
                }
            )
    return rows


def fronts_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    def lanes(counts: Mapping[str, int]) -> str:
        return " ".join(f"{lane}={n}" for lane, n in sorted(counts.items())) or "-"

    def met(row: Mapping[str, Any]) -> str:
        found = row["ttft_slo_met"]
        return "-" if found is None else f"{found['client']} / {found['laneway']}"

    def ttft(row: Mapping[str, Any]) -> str:
        found = row["ttft_difference_pct"]
        if found is None:
            return "-"
        verdict = "agree" if row["ttft_agrees"] else "DISAGREE"
        return f"{found['p50']:+.1f} / {found['p99']:+.1f} / {found['mean']:+.1f} % {verdict}"

    header = (
        "config", "front", "interactive lanes", "long lanes", "within SLO",
        "TTFT SLO met client / laneway", "laneway TTFT vs client P50 / P99 / mean",
    )  # fmt: skip
    body = [
        (
            row["config"],
            row["front"],
            lanes(row["interactive_lanes"]),
            lanes(row["long_lanes"]),
            row["within_slo"],
            met(row),
            ttft(row),
        )
        for row in sorted(rows, key=lambda r: (r["config"], r["front"] != GATEWAY))
    ]
    return format_table(header, body)


def run_live_mode(
    args: argparse.Namespace,
    scenario: SeedScenario,
    profile: Profile,
    configs: Sequence[ClusterConfig],
    virtual_results: Sequence[RunResult],
    time_scale: float,
    heading: str,
) -> int:
    started = time.perf_counter()
    fronts = tuple(args.fronts)
    by_front = asyncio.run(_run_all(configs, scenario, profile, time_scale, fronts))
    runs = by_front[fronts[0]]
    wall_s = time.perf_counter() - started
    virtual = against_unified_full([summarize(result, scenario) for result in virtual_results])
    live = against_unified_full([summarize(run.result, scenario) for run in runs])

    print(f"seed experiment, live at time scale {time_scale:g} beside virtual: {heading}")
    print(f"live wall time {wall_s:.1f} s")
    for front in fronts:
        if len(fronts) > 1:
            print()
            print(f"== through {front}")
        live_front = against_unified_full(
            [summarize(run.result, scenario) for run in by_front[front]]
        )
        for virtual_summary, live_summary, run in zip(
            virtual, live_front, by_front[front], strict=True
        ):
            _print_config(virtual_summary, live_summary, run, time_scale)
    compared = fronts_compared(by_front, time_scale)
    if len(fronts) > 1:
        print()
        print(
            "lanes and SLO verdicts by front (wall-time TTFT, laneway's own against the client's)"
        )
        print("\n".join(fronts_table(compared)))
    if args.json is not None:
        document = seed_json(scenario, profile.name, live, wall_s, mode="live")
        document["time_scale"] = time_scale
        document["configs"] = {
            summary.name: live_config_json(summary, run, time_scale)
            for summary, run in zip(live, runs, strict=True)
        }
        document["fronts"] = {
            front: {
                run.result.config.name: live_config_json(
                    summarize(run.result, scenario), run, time_scale
                )
                for run in by_front[front]
            }
            for front in fronts[1:]
        }
        document["fronts_compared"] = compared
        document["virtual"] = {"configs": {s.name: config_json(s) for s in virtual}}
        document["difference_pct"] = {
            v.name: _differences(v, lv) for v, lv in zip(virtual, live, strict=True)
        }
        write_results(args.json, document)
    if args.plot is not None:
        from laneway.bench.seed.plot import plot_seed

        title = (
            f"seed experiment, virtual and live (time scale {time_scale:g}), "
            f"{scenario.gpus} x {profile.name}, seed {scenario.seed}"
        )
        series = [("virtual", virtual_results), ("live", [run.result for run in runs])]
        plot_seed(series, scenario, args.plot, title)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _print_config(
    virtual: ConfigSummary, live: ConfigSummary, run: LiveRun, time_scale: float
) -> None:
    print()
    print(comparison_table(virtual, live))
    cpu = run.cpu
    print(
        f"requests: {len(run.records)} of {run.issued} accounted for; "
        f"long requests' lanes {lanes_of(run, 'long')}; CPU over {cpu.wall_s:.0f} s: "
        f"generator {cpu.cores(cpu.generator_s):.2f}, {run.front} {cpu.cores(cpu.gateway_s):.2f}, "
        f"engines {cpu.cores(cpu.engines_s):.2f} cores"
    )
    check = ttft_agreement(run, time_scale)
    if check is None:
        print("gateway TTFT: no stream timed")
    else:
        print("\n".join(agreement_table(check, SLO_S)))
