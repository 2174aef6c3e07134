"""`--plot`: interactive TBT and TTFT over time, one row per configuration, burst marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from laneway.simulator.report import percentile
from laneway.simulator.runner import RunResult
from laneway.simulator.seed import TBT_SLO_S, TTFT_SLO_S, SeedScenario

BIN_S = 0.5


def _binned(
    at: Sequence[float], values: Sequence[float], fraction: float
) -> tuple[list[float], list[float]]:
    """Per BIN_S window: the window's centre and the given percentile of its values, in ms."""
    bins: dict[int, list[float]] = {}
    for when, value in zip(at, values, strict=True):
        bins.setdefault(int(when // BIN_S), []).append(value)
    centres, points = [], []
    for index in sorted(bins):
        centres.append((index + 0.5) * BIN_S)
        points.append(percentile(sorted(bins[index]), fraction) * 1e3)
    return centres, points


def plot_seed(results: Sequence[RunResult], scenario: SeedScenario, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(results)
    figure, axes = plt.subplots(
        rows, 2, figsize=(13, 2.6 * rows + 0.8), sharex=True, sharey="col", squeeze=False
    )
    for row, result in enumerate(results):
        tbt_axis, ttft_axis = axes[row]
        centres, p99 = _binned(result.tbt_at_s, result.tbt_s, 0.99)
        _, worst = _binned(result.tbt_at_s, result.tbt_s, 1.0)
        tbt_axis.plot(centres, worst, color="tab:red", linewidth=0.8, label="max")
        tbt_axis.plot(centres, p99, color="tab:blue", linewidth=1.2, label="P99")
        tbt_axis.axhline(TBT_SLO_S * 1e3, color="gray", linestyle="--", linewidth=0.8, label="SLO")
        ttft_axis.scatter(
            result.ttft_at_s, [v * 1e3 for v in result.ttft_s], s=2, color="tab:green", alpha=0.4
        )
        ttft_axis.axhline(TTFT_SLO_S * 1e3, color="gray", linestyle="--", linewidth=0.8)
        for axis in (tbt_axis, ttft_axis):
            axis.set_yscale("log")
            axis.axvline(scenario.burst_at_s, color="black", linewidth=1.0)
            if result.batch_finished_at_s:
                axis.axvspan(
                    scenario.burst_at_s, max(result.batch_finished_at_s), color="orange", alpha=0.12
                )
            axis.grid(True, which="major", alpha=0.3)
        tbt_axis.set_ylabel(f"{result.config.name}\nTBT ms (per {BIN_S:g} s)")
        ttft_axis.set_ylabel("TTFT ms (per request)")
        if row == 0:
            tbt_axis.legend(loc="upper right", fontsize=8)
            tbt_axis.set_title("interactive time between tokens")
            ttft_axis.set_title("interactive time to first token, by arrival")
    for axis in axes[-1]:
        axis.set_xlabel("simulated time s (line: long burst arrives; shaded: batch running)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
