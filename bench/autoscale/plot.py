"""`laneway bench autoscale --plot`: replicas per lane and demand over the day."""

from __future__ import annotations

from pathlib import Path

from laneway.bench.autoscale.day import DayScenario
from laneway.simulator.elastic import (
    ElasticResult,
)


def plot_day(results: dict[str, ElasticResult], day: DayScenario, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for row, lane in enumerate(("interactive", "batch")):
        ax = axes[row]
        elastic = results["elastic"].traces[row]
        static = results["static"].traces[row]
        hours = [t / day.day_s * 24 for t in elastic.at_s]
        ax.step(hours, elastic.replicas, where="post", label="elastic replicas", color="tab:blue")
        ax.step([t / day.day_s * 24 for t in static.at_s], static.replicas, where="post",
                label="static replicas", color="tab:gray", linestyle="--")  # fmt: skip
        ax.set_ylabel(f"{lane} replicas")
        ax.set_ylim(bottom=0)
        demand = ax.twinx()
        demand.plot(hours, elastic.demand, color="tab:orange", alpha=0.6, linewidth=0.8)
        demand.set_ylabel("requests queued + in flight", color="tab:orange")
        ax.legend(loc="upper left")
    axes[1].set_xlabel("hour of the compressed day")
    figure.suptitle("laneway bench autoscale: replicas per lane and demand")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
