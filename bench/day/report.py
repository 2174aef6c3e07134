"""The day's table and JSON: one row per configuration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laneway.simulator.day import DayResult, DayScenario
from laneway.tables import format_table

HEADER = (
    "config",
    "turns",
    "done",
    "in SLO",
    "TTFT P99 ms",
    "TBT P99 ms",
    "doc Mtok",
    "docs done",
    "GPU busy",
    "reclaims",
    "reclaim P99 ms",
    "twice",
)


def config_json(result: DayResult) -> dict[str, Any]:
    # Of the turns finished and those the day ended after they had missed their SLO.
    share = result.in_slo_share
    return {
        "name": result.config.name,
        "summary": result.config.summary,
        "turns_started": result.turns_started,
        "turns_completed": result.turns_completed,
        "turns_missed_unfinished": result.turns_missed_unfinished,
        "turns_in_slo": result.turns_in_slo,
        "turns_in_slo_share": share,
        "ttft_p99_ms": result.p99_ms(result.ttft_s),
        "tbt_p99_ms": result.p99_ms(result.tbt_s),
        "document_tokens_prefilled": result.document_tokens_prefilled,
        "documents_completed": result.documents_completed,
        "gpu_busy": result.gpu_busy,
        "reclaims": len(result.reclaim_ms),
        "reclaim_p99_ms": result.p99_ms(tuple(ms / 1000 for ms in result.reclaim_ms)),
        "recomputed_tokens": result.recomputed_tokens,
        "recomputed_share": result.recomputed_share,
        "roles": [
            {"at_s": r.at_s, "chat": r.chat, "batch": r.batch, "draining": r.draining}
            for r in result.roles
        ],
    }


def day_json(
    scenario: DayScenario, profile: str, results: Sequence[DayResult], wall_s: float
) -> dict[str, Any]:
    return {
        "scenario": {
            "gpus": scenario.gpus,
            "trough_sessions": scenario.trough_sessions,
            "peak_sessions": scenario.peak_sessions,
            "day_s": scenario.day_s,
            "documents": scenario.documents,
            "document_tokens": list(scenario.document_tokens),
            "ramp": scenario.ramp,
            "seed": scenario.seed,
        },
        "profile": profile,
        "wall_s": wall_s,
        "configs": [config_json(result) for result in results],
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def day_table(results: Sequence[DayResult]) -> str:
    rows = []
    for result in results:
        row = config_json(result)
        share = row["turns_in_slo_share"]
        rows.append(
            (
                result.config.name,
                str(result.turns_started),
                str(result.turns_completed),
                "-" if share is None else f"{share * 100:.2f}%",
                _ms(row["ttft_p99_ms"]),
                _ms(row["tbt_p99_ms"]),
                f"{result.document_tokens_prefilled / 1e6:.2f}",
                str(result.documents_completed),
                f"{result.gpu_busy * 100:.0f}%",
                str(len(result.reclaim_ms)),
                _ms(row["reclaim_p99_ms"]),
                f"{result.recomputed_share * 100:.2f}%",
            )
        )
    return "\n".join(format_table(HEADER, rows, rule=True))
