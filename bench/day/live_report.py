"""The live mode's shell: each configuration live, then the same day in virtual time, the
two tables and their ratios (the issue's goal: live within 15 % of virtual on turns in SLO
and documents completed)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneway.bench.day.live import LiveDay, run_live_day, stderr_say
from laneway.bench.day.report import config_json, day_json, day_table
from laneway.bench.harness.flags import ScenarioOptions, run_async, write_results
from laneway.simulator.day import DayResult, DayScenario
from laneway.simulator.profiles import Profile
from laneway.simulator.seed import ClusterConfig
from laneway.tables import format_table

AGREEMENT = 0.15  # the goal: live within 15 % of virtual


@dataclass(frozen=True)
class Agreement:
    config: str
    live_in_slo: int
    virtual_in_slo: int
    live_docs: int
    virtual_docs: int

    @property
    def in_slo_ratio(self) -> float | None:
        return _ratio(self.live_in_slo, self.virtual_in_slo)

    @property
    def docs_ratio(self) -> float | None:
        return _ratio(self.live_docs, self.virtual_docs)

    @property
    def within(self) -> bool:
        return all(
            ratio is not None and abs(ratio - 1) <= AGREEMENT
            for ratio in (self.in_slo_ratio, self.docs_ratio)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "turns_in_slo": {"live": self.live_in_slo, "virtual": self.virtual_in_slo},
            "turns_in_slo_ratio": self.in_slo_ratio,
            "documents_completed": {"live": self.live_docs, "virtual": self.virtual_docs},
            "documents_completed_ratio": self.docs_ratio,
            "within_15_pct": self.within,
        }


def _ratio(live: int, virtual: int) -> float | None:
    if virtual == 0:
        return 1.0 if live == 0 else None
    return live / virtual


def agreements(live: Sequence[DayResult], virtual: Sequence[DayResult]) -> list[Agreement]:
    return [
        Agreement(
            config=lv.config.name,
            live_in_slo=lv.turns_in_slo,
            virtual_in_slo=v.turns_in_slo,
            live_docs=lv.documents_completed,
            virtual_docs=v.documents_completed,
        )
        for lv, v in zip(live, virtual, strict=True)
    ]


def agreement_table(rows: Sequence[Agreement]) -> str:
    def shown(ratio: float | None) -> str:
        return "-" if ratio is None else f"{ratio:.2f}"

    header = (
        "config", "in SLO live", "in SLO virtual", "ratio",
        "docs live", "docs virtual", "ratio", "within 15 %",
    )  # fmt: skip
    body = [
        (
            row.config,
            str(row.live_in_slo),
            str(row.virtual_in_slo),
            shown(row.in_slo_ratio),
            str(row.live_docs),
            str(row.virtual_docs),
            shown(row.docs_ratio),
            "yes" if row.within else "NO",
        )
        for row in rows
    ]
    return "\n".join(format_table(header, body, rule=True))


def live_config_json(run: LiveDay) -> dict[str, Any]:
    roles = {(sample.chat, sample.batch, sample.draining) for sample in run.result.roles}
    return {
        **config_json(run.result),
        "requests": {
            "turns_issued": run.turns_issued,
            "turns_accounted_for": run.turns_accounted,
            "turns_failed": dict(run.turns_failed),
            "documents_failed": dict(run.documents_failed),
        },
        "reclaimed_requests": run.reclaimed_requests,
        "roles_changed": len(roles) > 1,
        "model_s": round(run.end_s, 2),
    }


async def _run_all(
    configs: Sequence[ClusterConfig],
    scenario: DayScenario,
    profile: Profile,
    time_scale: float,
    stream_documents: bool,
) -> list[LiveDay]:
    return [
        await run_live_day(
            config,
            scenario,
            profile,
            time_scale,
            stderr_say(config.name),
            stream_documents=stream_documents,
        )
        for config in configs
    ]


def run_live_mode(
    scenario: DayScenario,
    options: ScenarioOptions,
    configs: Sequence[ClusterConfig],
    *,
    stream_documents: bool,
) -> int:
    from laneway.bench.day.cli import heading, run_virtual_day

    profile, time_scale = options.profile, options.time_scale
    started = time.perf_counter()
    runs = run_async(_run_all(configs, scenario, profile, time_scale, stream_documents))
    live_wall_s = time.perf_counter() - started
    virtual, virtual_wall_s = run_virtual_day(scenario, profile, configs)
    live = [run.result for run in runs]
    rows = agreements(live, virtual)

    sent = "streamed" if stream_documents else "whole (stream: false)"
    print(
        f"day, live at time scale {time_scale:g} beside virtual: {heading(scenario, profile)}; "
        f"documents sent {sent}; {live_wall_s:.1f} s wall live, {virtual_wall_s:.1f} s virtual"
    )
    print()
    print("live (laneway sim engines, laneway gateway, clients timing every token)")
    print(day_table(live))
    for run in runs:
        print(
            f"  {run.result.config.name}: {run.turns_accounted} of {run.turns_issued} turns "
            f"accounted for (not completed: {dict(run.turns_failed) or 'none'}); documents "
            "not completed: "
            f"{dict(run.documents_failed) or 'none'}; {run.reclaimed_requests} batch requests "
            "taken off reclaimed replicas"
        )
    print()
    print("virtual (the same day, the same configurations)")
    print(day_table(virtual))
    print()
    print("live vs virtual: turns in SLO and documents completed (goal: within 15 %)")
    print(agreement_table(rows))
    if options.json is not None:
        document = day_json(scenario, profile.name, live, live_wall_s)
        document["mode"] = "live"
        document["time_scale"] = time_scale
        document["stream_documents"] = stream_documents
        document["configs"] = [live_config_json(run) for run in runs]
        document["virtual"] = {
            "wall_s": virtual_wall_s,
            "configs": [config_json(result) for result in virtual],
        }
        document["live_vs_virtual"] = [row.to_json() for row in rows]
        write_results(options.json, document)
    if options.plot is not None:
        from laneway.bench.day.plot import plot_day

        title = f"day (live, time scale {time_scale:g}), {scenario.gpus} x {profile.name}"
        plot_day(live, scenario, options.plot, title)
        print(f"wrote {options.plot}", file=sys.stderr)
    return 0
