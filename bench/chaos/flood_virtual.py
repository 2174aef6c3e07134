"""`laneway bench chaos --flood --mode virtual`: the flood goal judged on the cost model.

The same workload as the live run (`flood.py`), on the virtual runner
(`laneway.simulator.flood_experiment`): the gateway's ledger with the flood tenant's caps,
the simulator's engines, no machine noise. For each of `rounds` seeds it runs the steady
tenant alone (the flood tenant sends nothing), the flood tenant at its share (1x), and every
flood factor at every flood queue; the steady tenant's turns are the same in every run of a
seed, so each flooded run compares pairwise with that seed's unloaded one. A row reports the
median over seeds and the spread (lowest and highest) of the per-seed ratios.

With `max_prompt_tokens` (`--flood-max-prompt-tokens`) every flooded run is made again with
the flood tenant's `maxConcurrentPromptTokens` at each of those caps, its count caps
unchanged; those rows also divide by the same seed's run without the token cap (`p99 /
uncapped`), and say what the cap costs the flood: its prompt tokens served over the
uncapped run's. The alone and 1x runs are the uncapped ones.

The goal: at 10x its share, the steady tenant's TTFT P99 within 10 % of its unloaded run
(the alone run: the strict reading; the 1x run is shown beside it) in the median seed, and
none of its requests refused in any run; with token caps, judged for each cap (and without
one), and met where any of them meets it.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from laneway.bench.demo.run import DEMO_POOLS
from laneway.bench.harness.machine import machine_description
from laneway.routing.picker import PickingSettings
from laneway.simulator.flood_experiment import FloodResult, FloodScenario, run_flood_virtual
from laneway.simulator.profiles import PROFILES
from laneway.stats import percentile
from laneway.tables import format_table

GOAL_FACTOR = 10.0  # the goal's flood, in shares
GOAL_RATIO = 1.10


@dataclass(frozen=True)
class VirtualFloodOptions:
    scenario: FloodScenario = field(default_factory=FloodScenario)
    factors: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0)
    queues: tuple[int, ...] = (8, 40)
    rounds: int = 3  # seeds, from the scenario's
    profile: str = "h200-llama3-8b"
    # The chat pool's maxConcurrentRequests per endpoint (and its engines' seats); None:
    # the demo's 256, so that only the flood's caps bound it.
    pool_slots: int | None = None
    # The flood tenant's maxConcurrentPromptTokens, each swept beside the uncapped runs.
    max_prompt_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class SweepRow:
    flood_factor: float  # 0: the steady tenant alone; 1: the flood tenant at its share
    flood_queue: int | None  # None where the flood never queues (alone, at its share)
    flood_max_prompt_tokens: int | None  # its token cap; None: none
    steady_requests: int  # counted steady requests, the fewest of any seed
    steady_ttft_p50_ms: float  # medians over the seeds
    steady_ttft_p99_ms: float
    ratio_alone: tuple[float, float, float]  # P99 over the alone run's: median, low, high
    ratio_share: tuple[float, float, float]  # the same over the 1x run's
    # The same over the run without the token cap (same seed, factor and queue); 1 there.
    ratio_uncapped: tuple[float, float, float]
    steady_refused: int  # over every seed
    flood_ok: int
    flood_prompt_tokens: int  # its prompt tokens served, over every seed
    # Those over the uncapped run's, per seed: what the token cap costs it (1 uncapped).
    flood_tokens_uncapped: tuple[float, float, float]
    flood_refused: int
    flood_peak_running: int  # the most of its requests running at once, in any seed


@dataclass(frozen=True)
class VirtualFloodReport:
    command: str
    machine: str
    options: dict[str, Any]
    rows: tuple[SweepRow, ...]
    # At GOAL_FACTOR, each token cap's (None: without one) median ratio to the alone run,
    # the worst queue's.
    goal_ratios: tuple[tuple[int | None, float], ...]
    goal_ratio: float | None  # the best of those
    goal_cap: int | None  # whose it is (None: without a token cap)
    goal_met: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _p99(result: FloodResult) -> float:
    return percentile(result.steady_ttft_s, 99)


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return (statistics.median(values), min(values), max(values))


Group = tuple[float, int | None, int | None]  # factor, queue, token cap


def _group(result: FloodResult, *, queue: bool = True) -> Group:
    scenario = result.scenario
    return (
        scenario.flood_factor,
        scenario.flood_queue if queue else None,
        scenario.flood_max_prompt_tokens,
    )


def sweep_rows(
    alone: Sequence[FloodResult], share: Sequence[FloodResult], runs: Sequence[FloodResult]
) -> tuple[SweepRow, ...]:
    """One row per (factor, queue, token cap), seeds paired by position in `alone` and
    `share`, a token-capped run with its seed's uncapped run of the same factor and queue
    (pure)."""
    by_seed = {a.scenario.seed: (a, s) for a, s in zip(alone, share, strict=True)}
    groups: dict[Group, list[FloodResult]] = {
        _group(alone[0], queue=False): list(alone),
        _group(share[0], queue=False): list(share),
    }
    for run in runs:
        groups.setdefault(_group(run), []).append(run)
    uncapped = {
        (r.scenario.seed, r.scenario.flood_factor, r.scenario.flood_queue): r
        for r in runs
        if r.scenario.flood_max_prompt_tokens is None
    }

    def without_cap(run: FloodResult) -> FloodResult:
        scenario = run.scenario
        return uncapped.get((scenario.seed, scenario.flood_factor, scenario.flood_queue), run)

    rows = []
    for (factor, queue, cap), results in groups.items():
        pairs = [(r, *by_seed[r.scenario.seed]) for r in results]
        plain = [without_cap(r) if cap is not None else r for r in results]
        rows.append(
            SweepRow(
                flood_factor=factor,
                flood_queue=queue,
                flood_max_prompt_tokens=cap,
                steady_requests=min(len(r.steady_ttft_s) for r in results),
                steady_ttft_p50_ms=statistics.median(
                    percentile(r.steady_ttft_s, 50) * 1000 for r in results
                ),
                steady_ttft_p99_ms=statistics.median(_p99(r) * 1000 for r in results),
                ratio_alone=_spread([_p99(r) / _p99(a) for r, a, _ in pairs]),
                ratio_share=_spread([_p99(r) / _p99(s) for r, _, s in pairs]),
                ratio_uncapped=_spread(
                    [_p99(r) / _p99(u) for r, u in zip(results, plain, strict=True)]
                ),
                steady_refused=sum(r.steady_refused for r in results),
                flood_ok=sum(r.flood_ok for r in results),
                flood_prompt_tokens=sum(r.flood_prompt_tokens for r in results),
                flood_tokens_uncapped=_spread(
                    [_share_of(r, u) for r, u in zip(results, plain, strict=True)]
                ),
                flood_refused=sum(r.flood_refused for r in results),
                flood_peak_running=max(r.flood_peak_running for r in results),
            )
        )
    return tuple(rows)


def _share_of(run: FloodResult, uncapped: FloodResult) -> float:
    if not uncapped.flood_prompt_tokens:
        return 1.0  # the flood sent nothing (alone): nothing to lose
    return run.flood_prompt_tokens / uncapped.flood_prompt_tokens


def report_of(
    command: str, options: VirtualFloodOptions, rows: tuple[SweepRow, ...]
) -> VirtualFloodReport:
    worst: dict[int | None, float] = {}  # the worst queue's, per token cap
    for row in rows:
        if row.flood_factor == GOAL_FACTOR:
            cap = row.flood_max_prompt_tokens
            worst[cap] = max(worst.get(cap, 0.0), row.ratio_alone[0])
    best = min(worst.items(), key=lambda item: item[1]) if worst else None
    refused = sum(row.steady_refused for row in rows)
    return VirtualFloodReport(
        command=command,
        machine=machine_description(),
        options=asdict(options),
        rows=rows,
        goal_ratios=tuple(worst.items()),
        goal_ratio=None if best is None else best[1],
        goal_cap=None if best is None else best[0],
        goal_met=best is not None and best[1] <= GOAL_RATIO and refused == 0,
    )


def run_sweep(
    options: VirtualFloodOptions, command: str, say: Callable[[str], None]
) -> VirtualFloodReport:
    profile = PROFILES[options.profile]
    pool, picking = DEMO_POOLS[0], PickingSettings()
    if options.pool_slots is not None:
        pool = replace(pool, engine=replace(pool.engine, max_num_seqs=options.pool_slots))
    base = options.scenario
    alone, share, runs = [], [], []
    for seed in range(base.seed, base.seed + options.rounds):
        seeded = replace(base, seed=seed)
        alone.append(run_flood_virtual(replace(seeded, flood_factor=0.0), pool, profile, picking))
        share.append(run_flood_virtual(replace(seeded, flood_factor=1.0), pool, profile, picking))
        for factor in options.factors:
            for queue in options.queues:
                for cap in (None, *options.max_prompt_tokens):
                    scenario = replace(
                        seeded, flood_factor=factor, flood_queue=queue, flood_max_prompt_tokens=cap
                    )
                    runs.append(run_flood_virtual(scenario, pool, profile, picking))
        flooded = len(options.factors) * len(options.queues) * (1 + len(options.max_prompt_tokens))
        say(f"seed {seed}: {2 + flooded} runs done")
    return report_of(command, options, sweep_rows(alone, share, runs))


def render(report: VirtualFloodReport) -> list[str]:
    def ratio(spread: tuple[float, float, float]) -> str:
        median, low, high = spread
        return f"{median:.3f} ({low:.3f}-{high:.3f})"

    capped = bool(report.options["max_prompt_tokens"])
    header = (
        "flood",
        "queue",
        *(("token cap",) if capped else ()),
        "steady n",
        "TTFT p50",
        "TTFT p99",
        "p99 / alone",
        "p99 / 1x",
        *(("p99 / uncapped",) if capped else ()),
        "steady refused",
        "flood ok",
        *(("flood tokens / uncapped",) if capped else ()),
        "flood 429",
        "flood peak running",
    )
    rows = [
        (
            "alone" if row.flood_factor == 0 else f"{row.flood_factor:g}x",
            "-" if row.flood_queue is None else str(row.flood_queue),
            *((_cap(row.flood_max_prompt_tokens),) if capped else ()),
            str(row.steady_requests),
            f"{row.steady_ttft_p50_ms:.1f} ms",
            f"{row.steady_ttft_p99_ms:.1f} ms",
            ratio(row.ratio_alone),
            ratio(row.ratio_share),
            *((ratio(row.ratio_uncapped),) if capped else ()),
            str(row.steady_refused),
            str(row.flood_ok),
            *((ratio(row.flood_tokens_uncapped),) if capped else ()),
            str(row.flood_refused),
            str(row.flood_peak_running),
        )
        for row in report.rows
    ]
    options = report.options
    scenario = options["scenario"]
    slots = options["pool_slots"] or DEMO_POOLS[0].engine.max_num_seqs
    prompts = scenario["flood_prompt_tokens"]
    flood_prompts = "" if prompts is None else f", its prompts {prompts[0]}-{prompts[1]} tokens"
    goal = "-" if report.goal_ratio is None else f"{report.goal_ratio:.3f}"
    if capped:
        goal += f" (token cap {_cap(report.goal_cap)}; " + ", ".join(
            f"{_cap(cap)}: {value:.3f}" for cap, value in report.goal_ratios
        )
        goal += ")"
    return [
        f"laneway bench chaos --flood --mode virtual: {report.command}",
        f"virtual time on {options['profile']}, {options['rounds']} seeds x "
        f"{scenario['duration_s']:g} s; the flood tenant's share "
        f"{scenario['flood_share']} running{flood_prompts}, the pool's {slots} per endpoint "
        "(ratios: median over seeds, lowest-highest)",
        "",
        *format_table(header, rows),
        "",
        f"steady TTFT p99 at {GOAL_FACTOR:g}x over its unloaded run: {goal} "
        f"(goal <= {GOAL_RATIO:.2f}, 0 steady requests refused)",
        f"goal {'met' if report.goal_met else 'NOT met'}",
    ]


def _cap(tokens: int | None) -> str:
    return "none" if tokens is None else f"{tokens:,}"


def stderr_say(message: str) -> None:
    print(f"chaos --flood --mode virtual: {message}", file=sys.stderr, flush=True)
