"""The seed plot's data (pure): windows without tokens are gaps, and a stall is a silence
while some stream waited, not one between sessions."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from laneway.bench.seed.plot import BIN_S, binned, stalls
from laneway.simulator.profiles import PROFILES
from laneway.simulator.seed import SeedScenario, seed_configs
from laneway.simulator.seed_experiment import RunResult

CONFIG = seed_configs(SeedScenario(), PROFILES["h200-llama3-8b"])[0]


def test_a_window_with_no_value_is_a_gap_not_a_line_across() -> None:
    at = [0.1, 0.2, 3.5 * BIN_S]
    centres, points = binned(at, [0.010, 0.020, 0.050], 100)
    assert centres == [0.5 * BIN_S, 1.5 * BIN_S, 2.5 * BIN_S, 3.5 * BIN_S]
    assert points[0] == pytest.approx(20.0)
    assert math.isnan(points[1])
    assert math.isnan(points[2])
    assert points[3] == pytest.approx(50.0)
    assert binned([], [], 99) == ([], [])


def result(
    tbt: Sequence[tuple[float, float]], first_tokens: Sequence[tuple[float, float]] = ()
) -> RunResult:
    """tbt: (when a gap ended, its length); first_tokens: (arrival, TTFT)."""
    return RunResult(
        config=CONFIG,
        ttft_s=tuple(ttft for _, ttft in first_tokens),
        ttft_at_s=tuple(arrival for arrival, _ in first_tokens),
        tbt_s=tuple(gap for _, gap in tbt),
        tbt_at_s=tuple(end for end, _ in tbt),
        interactive_completed=0,
        interactive_rejected=0,
        batch_finished_at_s=(),
        batch_tokens=0,
        batch_submitted=0,
        gpu_busy_s=0.0,
        end_s=20.0,
    )


def steady(start: float, end: float, step: float = 0.02) -> list[tuple[float, float]]:
    count = round((end - start) / step)
    return [(start + step * (i + 1), step) for i in range(count)]


def test_a_silence_that_a_stream_waits_through_is_a_stall() -> None:
    # One stream streams until 5 s, then waits 7 s for its next token (a whole-prompt
    # prefill on its replica); the other stream waits through the same silence.
    run = result([*steady(0, 5), (12.0, 7.0), *steady(12.0, 13.0), (12.5, 7.6)])
    assert stalls(run, BIN_S) == [(5.0, 12.0)]


def test_a_silence_between_sessions_is_no_stall() -> None:
    # Every stream ended at 5 s; the next one's first token came at 9 s.
    run = result([*steady(0, 5), *steady(9.0, 10.0)], first_tokens=[(8.98, 0.02)])
    assert stalls(run, BIN_S) == []


def test_a_silence_shorter_than_the_threshold_is_a_slow_step() -> None:
    run = result([*steady(0, 5, step=0.1)])
    assert stalls(run, BIN_S) == []
    assert stalls(run, 0.05) != []
