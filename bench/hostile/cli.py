"""`laneway bench hostile`: its flags and its command (the bench is laneway.bench.hostile.run)."""

from __future__ import annotations

import argparse
from typing import Any

from laneway.bench.harness.flags import (
    add_json_flag,
    add_value_flag,
    run_and_report,
)


def register_bench_hostile(bench: argparse._SubParsersAction[Any]) -> None:
    hostile = bench.add_parser(
        "hostile",
        help="/healthz latency while hostile request bodies arrive",
        description="Start a simulated engine and a gateway; probe /healthz on the quiet "
        "gateway, then while senders post bodies shaped to cost the gateway work (huge "
        "prompt lists, a megabytes-long role, many tiny messages, deep nesting, huge "
        "integers), all shapes together and each alone; report the probe's latency per "
        "phase against the quiet one. Then, on a second gateway with Redis and a tenants "
        "file, a hostile tenant: a --batch-lines batch (/healthz probed until it completes, "
        "the gateway's memory before, at peak and after), bodies sent a byte at a time, "
        "and the small cases of issue 29.",
    )
    add_value_flag(hostile, "--seconds", 5.0, "length of each phase")
    add_value_flag(hostile, "--senders", 3, "concurrent hostile senders")
    add_value_flag(
        hostile, "--batch-lines", 50_000, "requests in the tenant's batch (0: no tenant phases)"
    )
    add_json_flag(hostile)
    hostile.set_defaults(handler=run_bench_hostile)


def run_bench_hostile(args: argparse.Namespace) -> int:
    from laneway.bench.hostile.run import render, run_bench
    from laneway.errors import UsageError

    if args.seconds <= 0 or args.senders < 1 or not 0 <= args.batch_lines <= 50_000:
        raise UsageError(
            "--seconds must be positive, --senders at least 1, --batch-lines 0 to 50000"
        )
    return run_and_report(
        lambda command: run_bench(args.seconds, args.senders, args.batch_lines, command),
        render,
        args.json,
    )
