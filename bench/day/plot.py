"""`--plot`: each configuration's replicas per role over the day (chat, batch, draining),
with the day's active sessions on a second axis."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from laneway.simulator.day import DayResult, DayScenario


def plot_day(results: Sequence[DayResult], scenario: DayScenario, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        len(results), 1, figsize=(10, 1.7 * len(results) + 0.8), sharex=True, squeeze=False
    )
    for axis, result in zip((row[0] for row in axes), results, strict=True):
        at = [sample.at_s for sample in result.roles]
        chat = [sample.chat for sample in result.roles]
        draining = [sample.draining for sample in result.roles]
        batch = [sample.batch for sample in result.roles]
        axis.stackplot(at, chat, draining, batch, labels=("chat", "draining", "batch"),
                       colors=("tab:blue", "tab:gray", "tab:orange"), step="post")  # fmt: skip
        axis.set_ylim(0, scenario.gpus)
        axis.set_ylabel(f"{result.config.name}\nreplicas")
        sessions = axis.twinx()
        sessions.plot(at, [scenario.sessions_at(t) for t in at], color="black", linewidth=1)
        sessions.set_ylim(0, scenario.peak_sessions * 1.05)
        sessions.set_ylabel("sessions", fontsize=7)
    axes[0][0].legend(loc="upper left", fontsize=7)
    axes[-1][0].set_xlabel("virtual seconds into the day")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
