"""`--plot`: interactive TBT and TTFT over time, one row per configuration, burst marked.

Several series (virtual and live runs of the same configurations) share the axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from laneway.simulator.runner import RunResult
from laneway.simulator.seed import TBT_SLO_S, TTFT_SLO_S, SeedScenario
from laneway.stats import percentile

BIN_S = 0.5
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")

Series = tuple[str, Sequence[RunResult]]  # a label, and one result per configuration


def _binned(
    at: Sequence[float], values: Sequence[float], q: float
) -> tuple[list[float], list[float]]:
    """Per BIN_S window: the window's centre and the q-th percentile of its values, in ms."""
    bins: dict[int, list[float]] = {}
    for when, value in zip(at, values, strict=True):
        bins.setdefault(int(when // BIN_S), []).append(value)
    centres, points = [], []
    for index in sorted(bins):
        centres.append((index + 0.5) * BIN_S)
        points.append(percentile(bins[index], q) * 1e3)
    return centres, points


def plot_seed(series: Sequence[Series], scenario: SeedScenario, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(series[0][1])
    figure, axes = plt.subplots(
        rows, 2, figsize=(13, 2.6 * rows + 0.8), sharex=True, sharey="col", squeeze=False
    )
    for (label, results), color in zip(series, COLORS, strict=False):
        for row, result in enumerate(results):
            tbt_axis, ttft_axis = axes[row]
            centres, p99 = _binned(result.tbt_at_s, result.tbt_s, 99)
            _, worst = _binned(result.tbt_at_s, result.tbt_s, 100)
            tbt_axis.plot(centres, p99, color=color, linewidth=1.2, label=f"{label} P99")
            tbt_axis.plot(centres, worst, color=color, linewidth=0.6, linestyle=":",
                          label=f"{label} max")  # fmt: skip
            ttft_axis.scatter(result.ttft_at_s, [v * 1e3 for v in result.ttft_s], s=2,
                              color=color, alpha=0.4, label=label)  # fmt: skip
            if result.batch_finished_at_s:
                for axis in (tbt_axis, ttft_axis):
                    axis.axvspan(scenario.burst_at_s, max(result.batch_finished_at_s),
                                 color=color, alpha=0.08)  # fmt: skip
            tbt_axis.set_ylabel(f"{result.config.name}\nTBT ms (per {BIN_S:g} s)")
    for row in range(rows):
        tbt_axis, ttft_axis = axes[row]
        tbt_axis.axhline(TBT_SLO_S * 1e3, color="gray", linestyle="--", linewidth=0.8)
        ttft_axis.axhline(TTFT_SLO_S * 1e3, color="gray", linestyle="--", linewidth=0.8)
        ttft_axis.set_ylabel("TTFT ms (per request)")
        for axis in (tbt_axis, ttft_axis):
            axis.set_yscale("log")
            axis.axvline(scenario.burst_at_s, color="black", linewidth=1.0)
            axis.grid(True, which="major", alpha=0.3)
    axes[0][0].legend(loc="upper right", fontsize=7)
    axes[0][0].set_title("interactive time between tokens (dashed: 30 ms SLO)")
    axes[0][1].set_title("interactive time to first token, by arrival (dashed: 300 ms SLO)")
    if len(series) > 1:
        axes[0][1].legend(loc="upper right", fontsize=7, markerscale=4)
    for axis in axes[-1]:
        axis.set_xlabel("model time s (line: long burst arrives; shaded: batch running)")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
