"""`laneway bench prefix`: prefix-cache affinity against none and a sticky oracle, in
virtual time; and the prefix index's own cost (memory for 100k sessions, CPU per request)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import tracemalloc
from typing import TYPE_CHECKING, Any

from laneway.bench.harness.flags import (
    LiveFlags,
    ScenarioOptions,
    add_scenario_flags,
    add_value_flag,
    scenario_options,
    write_results,
)
from laneway.stats import percentile
from laneway.tables import format_table

if TYPE_CHECKING:
    from laneway.simulator.prefix_experiment import PrefixScenario

INDEX_SESSIONS = 100_000
INDEX_ENDPOINTS = 8
REQUEST_CHARS = 4096 * 4  # a 4k-token prompt


LIVE_TIME_SCALE = 1.0


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def register_bench_prefix(bench: argparse._SubParsersAction[Any]) -> None:
    from laneway.simulator.prefix_experiment import PrefixScenario

    full = PrefixScenario()
    prefix = bench.add_parser(
        "prefix",
        help="prefix-cache affinity: no affinity, laneway's scorer and session stickiness",
        description="Multi-turn chat sessions (shared system prompts, growing histories) and "
        "document sessions (several questions over one long document, batch lane) on "
        "engines with automatic prefix caching, under three pickers on the same GPUs: none "
        "(the default scorers without prefixAffinity), laneway (the defaults) and sticky "
        "(the sessionHash scorer alone: every session on one replica, an oracle for hit "
        "rate). --mode virtual routes with the routing library in virtual time; --mode live "
        "runs the same workload through laneway gateway and laneway sim processes, the "
        "gateway configured with each picker. Then the prefix index's memory for 100,000 "
        "sessions and its CPU per 4k-token request.",
    )
    add_value_flag(prefix, "--duration", full.duration_s, "seconds of sessions (model time)")
    add_value_flag(prefix, "--chat-sessions", full.chat_sessions, "closed-loop chat sessions")
    add_value_flag(
        prefix,
        "--document-sessions",
        full.document_sessions,
        "closed-loop document sessions (batch lane)",
    )
    add_value_flag(
        prefix, "--document-tokens", full.document_tokens, "prompt tokens of each shared document"
    )
    add_value_flag(
        prefix,
        "--interactive-replicas",
        full.interactive_replicas,
        "replicas (GPUs) of the chat pool",
    )
    add_value_flag(
        prefix, "--batch-replicas", full.batch_replicas, "replicas (GPUs) of the document pool"
    )
    live = LiveFlags(
        f"live mode: engines run this many times faster than real time "
        f"(default {LIVE_TIME_SCALE:g})",
        mode_help="virtual (default): discrete-event simulation; live: real processes over HTTP",
    )
    add_scenario_flags(prefix, seed=full.seed, live=live)
    prefix.set_defaults(handler=run_bench_prefix)


def _scenario_from(args: argparse.Namespace) -> tuple[PrefixScenario, ScenarioOptions]:
    """The scenario and the shared flags' choices; UsageError naming each bad flag."""
    from laneway.simulator.prefix_experiment import PrefixScenario, scenario_problems

    scenario = dataclasses.replace(
        PrefixScenario(),
        seed=args.seed,
        duration_s=args.duration,
        chat_sessions=args.chat_sessions,
        document_sessions=args.document_sessions,
        document_tokens=args.document_tokens,
        interactive_replicas=args.interactive_replicas,
        batch_replicas=args.batch_replicas,
    )
    return scenario, scenario_options(args, scenario_problems(scenario), LIVE_TIME_SCALE)


def run_bench_prefix(args: argparse.Namespace) -> int:
    from laneway.routing.picker import PickingSettings
    from laneway.simulator.prefix_experiment import PICKERS, PickerResult, run_prefix

    scenario, options = _scenario_from(args)
    time_scale = options.time_scale
    picking = PickingSettings()
    profile = options.profile
    started = time.perf_counter()
    pickers: dict[str, dict[str, Any]] = {}
    rows = []
    for picker in PICKERS:
        print(f"  {picker} ...", file=sys.stderr, flush=True)
        result: PickerResult
        if args.mode == "live":
            import asyncio

            from laneway.bench.prefix.live import run_live_picker

            result = asyncio.run(run_live_picker(scenario, profile, picker, picking, time_scale))
        else:
            result = run_prefix(scenario, profile, picker, picking)
        # No chat turns (--chat-sessions 0): no TTFT to report, null in the JSON.
        p50, p99 = (
            (percentile(result.ttft_s, q) * 1000 for q in (50, 99))
            if result.ttft_s
            else (None, None)
        )
        pickers[picker] = {
            "hit_rate": result.hit_rate,
            "prefill_tokens": result.prefill_tokens,
            "interactive": {"ttft_ms": {"p50": p50, "p99": p99}},
            "batch": {"makespan_s": result.batch_makespan_s},
            "load_imbalance": result.load_imbalance,
            "load_imbalance_by_pool": dict(result.pool_imbalance),
            "requests": result.requests,
        }
        rows.append(
            [picker, f"{result.hit_rate:.3f}", f"{result.prefill_tokens:,}", _ms(p50), _ms(p99),
             f"{result.batch_makespan_s:.1f}",
             " / ".join(f"{value:.3f}" for _, value in result.pool_imbalance),
             str(result.requests)]
        )  # fmt: skip
    wall_s = time.perf_counter() - started
    sticky = pickers["sticky"]["hit_rate"]
    mode = "virtual time" if args.mode == "virtual" else f"live, time scale {time_scale:g}"
    print(
        f"prefix affinity, {mode}: {scenario.interactive_replicas} interactive + "
        f"{scenario.batch_replicas} batch x {profile.name}, {scenario.chat_sessions} chat "
        f"sessions, {scenario.document_sessions} x {scenario.document_tokens}-token documents, "
        f"{scenario.duration_s:g} s, seed {scenario.seed}; {wall_s:.1f} s wall"
    )
    header = ["picker", "hit rate", "prefill tok", "TTFT p50 ms", "TTFT p99 ms",
              "batch makespan s", "imbalance chat / documents", "requests"]  # fmt: skip
    print("\n".join(format_table(header, rows, rule=True)))
    if sticky:
        print(f"laneway's hit rate is {pickers['laneway']['hit_rate'] / sticky:.1%} of sticky's")
    output: dict[str, Any] = {"mode": args.mode, "pickers": pickers, "wall_s": wall_s}
    if args.mode == "virtual":
        index = index_cost(picking.prefix.block_chars, picking.prefix.max_blocks,
                           picking.prefix.capacity_blocks)  # fmt: skip
        print(
            f"prefix index: {index['memory_mb']:.1f} MB for {INDEX_SESSIONS:,} sessions on "
            f"{INDEX_ENDPOINTS} endpoints ({index['blocks']:,} blocks kept); "
            f"{index['cpu_us_per_request']:.0f} us CPU per 4k-token request"
        )
        output["index"] = index
    if args.json is not None:
        write_results(args.json, output)
    return 0


def index_cost(block_chars: int, max_blocks: int, capacity_blocks: int) -> dict[str, float]:
    """Feed 100k sessions' prompts through one index, as the gateway would; measure it."""
    import random

    from laneway.routing.prefix_index import PrefixIndex, leading_block_hashes

    rng = random.Random(0)
    systems = ["".join(rng.choices("abcdefgh ", k=4000)) for _ in range(8)]
    index = PrefixIndex(capacity_blocks)
    tracemalloc.start()
    for session in range(INDEX_SESSIONS):
        text = systems[session % 8] + f"session {session} " * 200
        hashes = leading_block_hashes(text, block_chars, max_blocks)
        index.matched_blocks(hashes)
        index.record(f"http://10.0.0.{session % INDEX_ENDPOINTS}:8000", hashes)
    memory_bytes, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    request = systems[0] + "".join(rng.choices("abcdefgh ", k=REQUEST_CHARS - 4000))
    rounds = 2000
    started = time.process_time()
    for round_index in range(rounds):
        hashes = leading_block_hashes(request, block_chars, max_blocks)
        index.matched_blocks(hashes)
        index.record(f"http://10.0.0.{round_index % INDEX_ENDPOINTS}:8000", hashes)
    cpu_s = time.process_time() - started
    return {
        "memory_mb": memory_bytes / 1e6,
        "blocks": index.blocks,
        "cpu_us_per_request": cpu_s / rounds * 1e6,
    }
