"""`laneway bench chaos`: the accounting (pure) and a --quick run that must meet the goal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laneway.bench.chaos.accounting import (
    ChaosRecord,
    FaultEvent,
    check_batch,
    error_line_code,
    failure_verdict,
    window_of,
    window_rows,
    window_starts,
)
from laneway.bench.chaos.options import (
    CHAT,
    DOCUMENT,
    ENGINE,
    GATEWAY,
    OK,
    QUICK,
    REDIS,
    UNEXPECTED,
    WINDOWS,
    ChaosOptions,
    check_options,
)
from laneway.errors import UsageError

ON_ENGINE, ON_GATEWAY = "in flight on killed engine", "in flight on killed gateway"
FAULTS = (
    FaultEvent(ENGINE, "documents-1", killed_at_s=12.0, back_at_s=15.0, pool="documents"),
    FaultEvent(REDIS, "redis-server", killed_at_s=24.0, back_at_s=27.0),
    FaultEvent(GATEWAY, "b", killed_at_s=36.0, back_at_s=40.0),
)


def record(
    replica: str = "a",
    started: float = 1.0,
    ended: float = 2.0,
    status: int = 200,
    error: str | None = None,
    code: str | None = None,
    kind: str = CHAT,
    pool: str = "chat",
) -> ChaosRecord:
    return ChaosRecord(kind, replica, pool, False, started, ended, status, error, code, 0.05)


def test_windows_split_the_run_and_each_fault_opens_its_own() -> None:
    starts = window_starts(60.0)
    assert [starts[name] for name in WINDOWS] == [0.0, 12.0, 24.0, 36.0, 48.0]
    assert window_of(11.9, starts) == "before"
    assert window_of(12.0, starts) == ENGINE
    assert window_of(59.0, starts) == "after"


def test_only_failures_on_the_killed_process_at_the_kill_are_in_flight() -> None:
    cases = [
        # (record, verdict, why)
        (record(), OK, "a success"),
        (record("b", 35.0, 36.5, 0, "ClientPayloadError"), ON_GATEWAY, "cut by the replica kill"),
        (record("b", 35.0, 36.5, 200, "stream ended without [DONE]"), ON_GATEWAY, "cut mid-stream"),
        (record("a", 35.0, 36.5, 0, "ClientPayloadError"), UNEXPECTED, "the survivor dropped it"),
        (record("b", 37.0, 37.5, 0, "ClientPayloadError"), UNEXPECTED, "sent after the kill"),
        (record("b", 30.0, 33.0, 0, "ClientPayloadError"), UNEXPECTED, "before the kill"),
        (
            record("a", 11.0, 13.0, 200, "engine failed", "upstream_failed", DOCUMENT, "documents"),
            ON_ENGINE,
            "its engine died under it",
        ),
        (
            record("a", 11.0, 13.0, 200, "engine failed", "upstream_failed"),
            UNEXPECTED,
            "an engine of a pool that lost none",
        ),
        (record("a", 11.0, 13.0, 503, "busy", "no_healthy_endpoint"), UNEXPECTED, "not the kill"),
        (record("a", 23.0, 25.0, 502, "x", "upstream_failed"), UNEXPECTED, "Redis is no engine"),
        (record("a", 25.0, 26.0, 503, "x", "state_unavailable"), UNEXPECTED, "during Redis down"),
    ]
    for case, verdict, why in cases:
        assert failure_verdict(case, FAULTS) == verdict, why


def test_window_rows_count_verdicts_and_chat_ttft_per_window() -> None:
    records = [
        record("a", 1.0, 2.0),
        record("b", 35.0, 36.5, 0, "ClientPayloadError"),
        record("a", 37.0, 38.0, 503, "x", "state_unavailable"),
    ]
    rows = {row.window: row for row in window_rows(records, FAULTS, window_starts(60.0))}
    assert (rows["before"].sent, rows["before"].ok, rows["before"].chat_ttft_p50_s) == (1, 1, 0.05)
    assert (rows[REDIS].sent, rows[REDIS].in_flight_on_killed) == (1, 1)
    assert (rows[GATEWAY].unexpected, rows[GATEWAY].chat_ttft_p50_s) == (1, None)


def test_the_batch_check_finds_lost_doubled_and_unknown_items() -> None:
    check = check_batch(
        ["a", "b", "c", "d"],
        output_ids=["a", "b", "b"],
        error_ids=["a", "x"],
        error_codes=["batch_lane_unreachable", "-"],
        status="completed",
        finished_at_s=30.0,
    )
    assert (check.completed, check.failed) == (3, 2)
    assert (check.lost, check.duplicated, check.unknown) == (2, 2, 1)  # c, d; b, a; x
    assert check.errors == {"batch_lane_unreachable": 1, "-": 1}


@pytest.mark.slow
def test_options_that_cannot_work_name_their_flag() -> None:
    check_options(ChaosOptions())
    check_options(QUICK)
    cases = [
        (ChaosOptions(outage_s=12.0), "--outage"),  # as long as a whole 12 s window
        (ChaosOptions(sessions=0), "--sessions"),
        (ChaosOptions(batch_items=0), "--batch-items"),
        (ChaosOptions(engine_pool="gpu"), "--kill-engine-in"),
        (ChaosOptions(settle_s=0), "--settle"),
    ]
    for options, flag in cases:
        with pytest.raises(UsageError, match=flag):
            check_options(options)


def test_an_error_line_says_why_it_failed() -> None:
    refused = {"custom_id": "a", "response": None, "error": {"code": "batch_expired"}}
    answered = {
        "custom_id": "b",
        "response": {"status_code": 502, "body": {"error": {"code": "upstream_failed"}}},
        "error": None,
    }
    bare = {"custom_id": "c", "response": {"status_code": 500, "body": "oops"}, "error": None}
    assert [error_line_code(line) for line in (refused, answered, bare)] == [
        "batch_expired",
        "upstream_failed",
        "500",
    ]


@pytest.mark.slow
@pytest.mark.timeout(600)  # a run that misses the goal waits out its 90 s of patience
def test_a_quick_chaos_run_loses_nothing_and_holds_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    tools = Path(__file__).resolve().parent.parent / ".tools" / "bin"
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"}
    args = ["bench", "chaos", "--quick", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "laneway.cli", *args],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    report = json.loads(out.read_text())
    assert done.returncode == (0 if report["goal_met"] else 1), done.stderr
    assert "in flight on killed" in done.stdout
    assert [fault["fault"] for fault in report["faults"]] == [ENGINE, REDIS, GATEWAY]
    assert [row["window"] for row in report["windows"]] == list(WINDOWS)
    assert sum(row["ok"] for row in report["windows"]) > 0, report["windows"]
    unexpected = [g for g in report["failures"] if g["verdict"] == UNEXPECTED]
    assert unexpected == [], unexpected
    batch = report["batch"]
    assert batch["status"] == "completed", batch
    assert batch["completed"] == batch["items"] == 30, batch
    assert (batch["lost"], batch["duplicated"], batch["unknown"], batch["failed"]) == (0, 0, 0, 0)
    held = report["held"]
    assert held["redis_load"] == {}, held
    assert held["redis_pending"] == 0, held
    assert all(value == 0 for gauges in held["gateway"].values() for value in gauges.values())
    assert all(count == 0 for count in held["engines"].values()), held
    assert held["shared"] == {"a": True, "b": True}, held
    assert report["goal_met"], done.stdout
