"""`laneway bench autoscale --sweep`: static peak provisioning against the elastic pools over
cells that each change one knob of the day, to find where the elastic design loses: the chat
peak (how many replicas it needs), the cold start, the ramp's steepness (a shorter
compressed day climbs from trough to peak faster), a sudden spike, and the interactive
headroom. Per cell and configuration: GPU-hours, interactive SLO attainment and TTFT P99,
batch documents done; per cell, the elastic saving.

Cells run in parallel processes, one per CPU (virtual time: results do not depend on it);
a static pool never starts a replica, so cells that change only the cold start or the
headroom share the base cell's static run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from laneway.bench.autoscale.day import DayScenario, simulate
from laneway.errors import UsageError
from laneway.tables import format_table

PEAK_RPS = (60.0, 140.0)
COLD_STARTS_S = (30.0, 120.0)
DAY_MINUTES = (15.0,)  # twice as steep a ramp as the base day's 30 minutes
# At hour 6 (the base day at 62.5 rps) a x1.6 spike brings the peak rate the static pool is
# sized for, within a second: the elastic pool must start replicas while it lasts.
SPIKE_FACTORS = (1.6,)
HEADROOMS = (0.0,)


@dataclass(frozen=True)
class Cell:
    knob: str  # the scenario knob this cell changes; "base" for none
    value: float
    day: DayScenario

    @property
    def label(self) -> str:
        return "base" if self.knob == "base" else f"{self.knob}={self.value:g}"


def sweep_cells(base: DayScenario) -> list[Cell]:
    replace = dataclasses.replace
    cells = [Cell(knob="base", value=0.0, day=base)]
    cells += [Cell(knob="peak_rps", value=v, day=replace(base, peak_rps=v)) for v in PEAK_RPS]
    cells += [
        Cell(knob="cold_start_s", value=v, day=replace(base, cold_start_s=v)) for v in COLD_STARTS_S
    ]
    cells += [
        Cell(knob="day_minutes", value=v, day=replace(base, day_s=v * 60)) for v in DAY_MINUTES
    ]
    cells += [
        Cell(knob="spike_factor", value=v, day=replace(base, spike_factor=v)) for v in SPIKE_FACTORS
    ]
    cells += [Cell(knob="headroom", value=v, day=replace(base, headroom=v)) for v in HEADROOMS]
    return cells


def static_key(day: DayScenario) -> DayScenario:
    """The scenario as far as the static pools can tell: no replica of theirs ever starts,
    and the headroom sizes only the elastic target."""
    base = DayScenario()
    return dataclasses.replace(day, cold_start_s=base.cold_start_s, headroom=base.headroom)


def _run(job: tuple[DayScenario, str, str]) -> dict[str, Any]:
    day, profile, config = job
    return simulate(day, profile, config)


def chosen_cells(base: DayScenario, only: Sequence[str]) -> list[Cell]:
    """The cells labelled in `only` (all when empty); UsageError naming an unknown label."""
    cells = sweep_cells(base)
    unknown = set(only) - {cell.label for cell in cells}
    if unknown:
        asked = ",".join(sorted(unknown))
        labels = ", ".join(cell.label for cell in cells)
        raise UsageError(f"--sweep-only {asked}: no such cell (cells: {labels})")
    return [cell for cell in cells if not only or cell.label in only]


def run_sweep(
    base: DayScenario, profile: str, only: Sequence[str] = ()
) -> list[tuple[Cell, dict[str, dict[str, Any]]]]:
    cells = chosen_cells(base, only)
    jobs: dict[tuple[DayScenario, str], tuple[DayScenario, str, str]] = {}
    for cell in cells:
        jobs[(static_key(cell.day), "static")] = (static_key(cell.day), profile, "static")
        jobs[(cell.day, "elastic")] = (cell.day, profile, "elastic")
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = dict(zip(jobs, pool.map(_run, jobs.values()), strict=True))
    return [
        (
            cell,
            {
                "static": done[(static_key(cell.day), "static")],
                "elastic": done[(cell.day, "elastic")],
            },
        )
        for cell in cells
    ]


def saved(configs: dict[str, dict[str, Any]]) -> float:
    return 1 - float(configs["elastic"]["gpu_hours"]) / float(configs["static"]["gpu_hours"])


def sweep_table(results: Sequence[tuple[Cell, dict[str, dict[str, Any]]]]) -> str:
    header = [
        "cell", "GPU-h static", "GPU-h elastic", "saved", "SLO static", "SLO elastic",
        "TTFT p99 static", "TTFT p99 elastic", "batch done",
    ]  # fmt: skip
    rows = []
    for cell, configs in results:
        static, elastic = configs["static"], configs["elastic"]
        rows.append(
            [
                cell.label,
                f"{static['gpu_hours']:.2f}",
                f"{elastic['gpu_hours']:.2f}",
                f"{saved(configs):.1%}",
                f"{static['interactive']['slo_attainment']:.2%}",
                f"{elastic['interactive']['slo_attainment']:.2%}",
                f"{static['interactive']['ttft_ms']['p99']:.0f}",
                f"{elastic['interactive']['ttft_ms']['p99']:.0f}",
                f"{elastic['batch']['completed']}/{elastic['batch']['submitted']}",
            ]
        )
    return "\n".join(format_table(header, rows))


def sweep_json(results: Sequence[tuple[Cell, dict[str, dict[str, Any]]]]) -> list[dict[str, Any]]:
    return [
        {
            "knob": cell.knob,
            "value": cell.value,
            "scenario": vars(cell.day),
            "configs": configs,
            "saved": round(saved(configs), 4),
        }
        for cell, configs in results
    ]
