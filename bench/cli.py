"""The harness's commands: `laneway demo` and every `laneway bench ...`, each registered by
its own room's `cli` module."""

from __future__ import annotations

import argparse
from typing import Any

from laneway.bench.autoscale.cli import register_bench_autoscale
from laneway.bench.chaos.cli import register_bench_chaos
from laneway.bench.counts.cli import register_bench_counts
from laneway.bench.day.cli import register_bench_day
from laneway.bench.demo.cli import register_demo
from laneway.bench.gateway.cli import register_bench_gateway
from laneway.bench.hostile.cli import register_bench_hostile
from laneway.bench.prefix.cli import register_bench_prefix
from laneway.bench.redis.cli import register_bench_redis
from laneway.bench.seed.cli import register_bench_seed


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `demo` and the benchmarks."""
    register_demo(commands)
    register_bench_gateway(bench)
    register_bench_redis(bench)
    register_bench_hostile(bench)
    register_bench_seed(bench)
    register_bench_autoscale(bench)
    register_bench_prefix(bench)
    register_bench_counts(bench)
    register_bench_chaos(bench)
    register_bench_day(bench)
