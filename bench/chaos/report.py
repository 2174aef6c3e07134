"""The chaos report as text (pure)."""

from __future__ import annotations

from laneway.bench.chaos.accounting import ChaosReport
from laneway.tables import format_table


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"


def render(report: ChaosReport) -> list[str]:
    lines = [f"laneway bench chaos: {report.command}", f"machine: {report.machine}", ""]
    lines.append("faults (seconds since the load began):")
    for fault in report.faults:
        lines.append(
            f"  {fault.fault:<8} {fault.target:<14} killed at {fault.killed_at_s:6.1f} s, "
            f"serving again at {fault.back_at_s:6.1f} s"
        )
    lines.append("")
    header = (
        "window",
        "sent",
        "ok",
        "in flight on killed",
        "unexpected",
        "failed over",
        "chat TTFT p50",
        "chat TTFT p99",
    )
    rows = [
        (
            row.window,
            str(row.sent),
            str(row.ok),
            str(row.in_flight_on_killed),
            str(row.unexpected),
            str(row.failed_over),
            _seconds(row.chat_ttft_p50_s),
            _seconds(row.chat_ttft_p99_s),
        )
        for row in report.windows
    ]
    lines += format_table(header, rows, rule=True)
    lines.append("")
    if report.failures:
        lines.append("failed requests, by window and why:")
        lines += [
            f"  {g.window:<8} {g.kind:<9} {g.verdict:<27} {g.count:>4} x {g.reason}"
            for g in report.failures
        ]
    else:
        lines.append("failed requests: none")
    batch = report.batch
    lines += [
        "",
        f"batch: {batch.items} items, {batch.status}"
        + (f" at {batch.finished_at_s:.1f} s" if batch.finished_at_s is not None else "")
        + f"; completed {batch.completed}, failed {batch.failed}, lost {batch.lost}, "
        f"done twice {batch.duplicated}, unknown {batch.unknown}",
    ]
    if batch.errors:
        lines.append("  error file: " + ", ".join(f"{c}: {n}" for c, n in batch.errors.items()))
    held = report.held
    gauges = "; ".join(
        f"{replica}: " + ", ".join(f"{name} {value:g}" for name, value in values.items())
        for replica, values in held.gateway.items()
    )
    lines += [
        "",
        f"held at the end ({held.settled_after_s:.1f} s after the load): {held.total:g}",
        f"  gateways: {gauges}",
        "  sharing state through Redis: "
        + ", ".join(f"{r} {'yes' if up else 'NO'}" for r, up in held.shared.items()),
        f"  redis: load fields not zero {len(held.redis_load)}, pending batch entries "
        f"{held.redis_pending}",
        "  engines running or waiting: "
        + ", ".join(f"{name} {count}" for name, count in held.engines.items()),
        "",
        "goal (0 lost, 0 done twice, 0 held, both replicas sharing state, no failure but in "
        "flight on a killed process): " + ("met" if report.goal_met else "NOT met"),
    ]
    return lines
