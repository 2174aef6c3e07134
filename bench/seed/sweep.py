"""`laneway bench seed --sweep`: the seed experiment over a grid of workloads, one knob at a time.

Each cell changes one knob of the base scenario (the long burst's size, the number of
sessions, the long prompts' length) and runs every configuration in virtual time. Per cell
and configuration: whether the interactive SLO held at the 99th percentile, the share of
turns within it, and the batch makespan as a ratio to unified-full's and to split's in the
same cell, so a policy can be judged where the seed's split keeps its promise.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from laneway.bench.seed.report import ConfigSummary, config_json
from laneway.simulator.seed import LONG_CONTEXT, TBT_SLO_S, TTFT_SLO_S, SeedScenario
from laneway.tables import format_table

LONG_BURSTS = (5, 20, 40)
SESSIONS = (100, 200, 300)
LONG_PROMPTS = (32768, 65536, 131072)


@dataclass(frozen=True)
class Cell:
    knob: str  # the scenario field this cell changes
    value: int
    scenario: SeedScenario

    @property
    def label(self) -> str:
        return f"{self.knob}={self.value}"


def sweep_cells(base: SeedScenario) -> list[Cell]:
    """The grid's cells; each knob's row includes the base scenario's own value."""
    longest = LONG_CONTEXT - base.long_output_tokens  # 128k less the output, as the lane holds
    cells = [
        Cell(knob="long_requests", value=n, scenario=dataclasses.replace(base, long_requests=n))
        for n in LONG_BURSTS
    ]
    cells += [
        Cell(knob="sessions", value=n, scenario=dataclasses.replace(base, sessions=n))
        for n in SESSIONS
    ]
    for tokens in (min(t, longest) for t in LONG_PROMPTS):
        cells.append(
            Cell(
                knob="long_tokens",
                value=tokens,
                scenario=dataclasses.replace(base, long_tokens=tokens),
            )
        )
    return cells


def keeps_slo(summary: ConfigSummary) -> bool:
    """Both SLOs at the 99th percentile: TTFT and the gap between tokens."""
    return summary.ttft_ms.p99 <= TTFT_SLO_S * 1e3 and summary.tbt_ms.p99 <= TBT_SLO_S * 1e3


def _ratio(value: float, baseline: float) -> float:
    if math.isnan(value) or math.isnan(baseline) or baseline == 0:
        return math.nan
    return value / baseline


def _split_makespan(summaries: Sequence[ConfigSummary]) -> float:
    return next((s.batch_makespan_s for s in summaries if s.name == "split"), math.nan)


def _fmt(value: float, pattern: str) -> str:
    return "-" if math.isnan(value) else format(value, pattern)


def sweep_table(cells: Sequence[tuple[Cell, Sequence[ConfigSummary]]]) -> str:
    header = [
        "cell", "config", "TTFT P99 ms", "TBT P99 ms", "SLOs kept", "turns in SLO",
        "makespan s", "vs unified-full", "vs split",
    ]  # fmt: skip
    rows: list[list[str]] = []
    for cell, summaries in cells:
        split = _split_makespan(summaries)
        for summary in summaries:
            rows.append(
                [
                    cell.label,
                    summary.name,
                    _fmt(summary.ttft_ms.p99, ",.1f"),
                    _fmt(summary.tbt_ms.p99, ".1f"),
                    "yes" if keeps_slo(summary) else "no",
                    _fmt(summary.slo_attainment, ".1%"),
                    _fmt(summary.batch_makespan_s, ".1f"),
                    _fmt(summary.makespan_vs_unified_full, ".2f") + "x",
                    _fmt(_ratio(summary.batch_makespan_s, split), ".2f") + "x",
                ]
            )
    return "\n".join(format_table(header, rows, rule=True))


def sweep_json(cells: Sequence[tuple[Cell, Sequence[ConfigSummary]]]) -> list[dict[str, Any]]:
    document = []
    for cell, summaries in cells:
        split = _split_makespan(summaries)
        configs = {}
        for summary in summaries:
            entry = config_json(summary)
            entry["keeps_slo"] = keeps_slo(summary)
            vs_split = _ratio(summary.batch_makespan_s, split)
            entry["batch"]["makespan_vs_split"] = (
                None if math.isnan(vs_split) else round(vs_split, 3)
            )
            configs[summary.name] = entry
        document.append({"knob": cell.knob, "value": cell.value, "configs": configs})
    return document
