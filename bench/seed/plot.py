"""`--plot`: interactive TBT and TTFT over time, one row per configuration, burst marked.

Several series (virtual and live runs of the same configurations) share the axes. A window
with no token in it has no TBT percentile: its lines break there rather than draw a calm
stretch across it, and a stall (no token at all for longer than a window while streams were
waiting for one) is hatched and labelled with its length. Shorter silences are slow steps,
which the TBT lines show: with every replica in a 100 ms prefill chunk, no token arrives
anywhere for tens of milliseconds on every step.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from pathlib import Path

from laneway.simulator.seed import TBT_SLO_S, TTFT_SLO_S, SeedScenario
from laneway.simulator.seed_experiment import RunResult
from laneway.stats import percentile

BIN_S = 0.5
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple")

Series = tuple[str, Sequence[RunResult]]  # a label, and one result per configuration


def binned(
    at: Sequence[float], values: Sequence[float], q: float
) -> tuple[list[float], list[float]]:
    """Per BIN_S window: its centre and the q-th percentile of its values in ms, NaN where the
    window has none (from the first window with values to the last)."""
    bins: dict[int, list[float]] = {}
    for when, value in zip(at, values, strict=True):
        bins.setdefault(int(when // BIN_S), []).append(value)
    if not bins:
        return [], []
    indices = range(min(bins), max(bins) + 1)
    centres = [(index + 0.5) * BIN_S for index in indices]
    points = [percentile(bins[i], q) * 1e3 if i in bins else math.nan for i in indices]
    return centres, points


def stalls(result: RunResult, longer_than_s: float) -> list[tuple[float, float]]:
    """Spans longer than `longer_than_s` in which no interactive token arrived anywhere while
    some stream had begun and was waiting for its next token."""
    arrivals = sorted(
        [*result.tbt_at_s, *(a + t for a, t in zip(result.ttft_at_s, result.ttft_s, strict=True))]
    )
    # Each gap between two tokens of one stream is a wait; the latest end among the waits
    # begun by a given time says whether one of them spans a silence that starts then.
    waits = sorted((end - gap, end) for end, gap in zip(result.tbt_at_s, result.tbt_s, strict=True))
    starts = [start for start, _ in waits]
    latest_end = list(itertools.accumulate((end for _, end in waits), max))
    spans = []
    for silent_from, silent_to in itertools.pairwise(arrivals):
        if silent_to - silent_from <= longer_than_s:
            continue
        begun = bisect.bisect_right(starts, silent_from)
        if begun and latest_end[begun - 1] >= silent_to:
            spans.append((silent_from, silent_to))
    return spans


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
            centres, p99 = binned(result.tbt_at_s, result.tbt_s, 99)
            _, worst = binned(result.tbt_at_s, result.tbt_s, 100)
            tbt_axis.plot(centres, p99, color=color, linewidth=1.2, label=f"{label} P99")
            tbt_axis.plot(centres, worst, color=color, linewidth=0.6, linestyle=":",
                          label=f"{label} max")  # fmt: skip
            ttft_axis.scatter(result.ttft_at_s, [v * 1e3 for v in result.ttft_s], s=2,
                              color=color, alpha=0.4, label=label)  # fmt: skip
            if result.batch_finished_at_s:
                for axis in (tbt_axis, ttft_axis):
                    axis.axvspan(scenario.burst_at_s, max(result.batch_finished_at_s),
                                 color=color, alpha=0.08)  # fmt: skip
            for start, end in stalls(result, BIN_S):
                tbt_axis.axvspan(start, end, facecolor="none", edgecolor=color, hatch="///",
                                 linewidth=0, label=f"{label}: no token (stall)")  # fmt: skip
                tbt_axis.text(end + 0.5, 0.9, f"stall: no token\nfor {end - start:.1f} s",
                              transform=tbt_axis.get_xaxis_transform(), va="top",
                              fontsize=8, color=color)  # fmt: skip
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
