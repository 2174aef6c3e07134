"""`laneway bench day --mode live --quick`: the day through real `laneway sim` engines and the
real gateway, beside its virtual run.

Structure and invariants only (lending moved replicas between the lanes, documents
completed, every turn accounted for, the tables and JSON shaped as the virtual mode's, the
comparison with the virtual run present); never timings or the figures themselves. And no
child process outlives the run, however it ends.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from support.marks import (
    HANG_S,
    assert_all_gone,
    marked_environment,
    marked_run,
    processes_marked,
    wait_for_children,
)

from laneway.bench.day.cli import QUICK_LIVE

BENCH = [sys.executable, "-m", "laneway.cli", "bench", "day", "--mode", "live", "--quick"]
# The fixed split beside lending on the quick day's 4 GPUs (lending owns 3 of them).
CONFIGS = ["fixed-2+2", "lending"]
LENDER_OWN, BORROWER_OWN = 3, 1


def test_quick_live_day_lends_completes_documents_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    out = tmp_path / "day.json"
    # Twice the default speed and two thirds of the day, to keep the suite quick: nothing
    # here depends on how faithful the timing is. The first lend comes after 5 s of quiet.
    quicker = ["--time-scale", "0.5", "--day", "16"]
    argv = [*BENCH, *quicker, "--configs", ",".join(CONFIGS), "--json", str(out)]
    with marked_run() as mark:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            check=False,
            env=marked_environment(mark),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert_all_gone(processes_marked(mark))
    assert "day live: lending" in result.stderr  # progress while it ran
    for table in ("live (laneway sim", "virtual (the same day", "live vs virtual"):
        assert table in result.stdout
    document = json.loads(out.read_text())
    assert document["mode"] == "live"
    assert document["scenario"]["gpus"] == QUICK_LIVE.gpus
    live = {c["name"]: c for c in document["configs"]}
    virtual = {c["name"]: c for c in document["virtual"]["configs"]}
    assert list(live) == list(virtual) == CONFIGS
    assert set(live["lending"]) >= set(virtual["lending"])  # the virtual columns, and more
    for name, c in live.items():
        requests = c["requests"]
        assert requests["turns_issued"] == requests["turns_accounted_for"], name
        # Only the day's end cuts a turn or a document short; nothing fails.
        assert set(requests["turns_failed"]) <= {"cut off at the time limit"}, name
        assert set(requests["documents_failed"]) <= {"cut off at the day's end"}, name
        assert 0 < c["turns_in_slo"] <= c["turns_completed"] <= c["turns_started"], name
        assert c["documents_completed"] > 0, name
        for sample in c["roles"]:
            assert sample["chat"] + sample["batch"] + sample["draining"] == QUICK_LIVE.gpus
    fixed = live["fixed-2+2"]
    assert not fixed["roles_changed"]
    assert fixed["reclaims"] == 0
    lending = live["lending"]
    assert lending["roles_changed"]
    # It lent: the batch lane had more than its own replica, chat never fewer than one.
    assert max(s["batch"] for s in lending["roles"]) > BORROWER_OWN
    assert min(s["batch"] for s in lending["roles"]) >= BORROWER_OWN
    assert min(s["chat"] for s in lending["roles"]) >= 1
    rows = {row["config"]: row for row in document["live_vs_virtual"]}
    assert list(rows) == CONFIGS
    for name, row in rows.items():
        assert row["documents_completed"]["live"] == live[name]["documents_completed"]
        assert row["turns_in_slo"]["virtual"] == virtual[name]["turns_in_slo"]
        assert isinstance(row["within_15_pct"], bool)


def test_ctrl_c_stops_every_child() -> None:
    with subprocess.Popen(
        [*BENCH, "--configs", "lending"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as bench:
        try:
            children = wait_for_children(bench, QUICK_LIVE.gpus + 1)  # engines, the gateway
            bench.send_signal(signal.SIGINT)
            _, err = bench.communicate(timeout=HANG_S)
        finally:
            bench.kill()
    assert bench.returncode == 130, err[-2000:]
    assert "interrupted" in err
    assert "Traceback" not in err
    assert_all_gone(children)


def test_live_refuses_what_it_cannot_run() -> None:
    result = subprocess.run(
        [*BENCH, "--configs", "unified-priority,fixed-3+5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    # The fixed splits are named for the GPUs they divide: 4 here.
    assert "--configs: unknown fixed-3+5; on 4 GPUs choose from" in result.stderr
    assert "fixed-2+2, fixed-3+1, lending" in result.stderr
    assert "unified-priority runs in --mode virtual only" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_gateways_metrics_read_as_the_days_columns() -> None:
    from laneway.bench.day.live import read_gateway, role_sample
    from laneway.simulator.day import day_configs
    from laneway.simulator.profiles import PROFILES

    text = "\n".join(
        [
            'laneway_gateway_lending_replicas{pool="realtime",role="serving"} 1',
            'laneway_gateway_lending_replicas{pool="realtime",role="lent"} 1',
            'laneway_gateway_lending_replicas{pool="realtime",role="draining"} 1',
            "# TYPE laneway_gateway_reclaim_seconds histogram",
            'laneway_gateway_reclaim_seconds_bucket{pool="realtime",le="0.01"} 0',
            'laneway_gateway_reclaim_seconds_bucket{pool="realtime",le="0.02"} 2',
            'laneway_gateway_reclaim_seconds_bucket{pool="realtime",le="0.05"} 3',
            'laneway_gateway_reclaim_seconds_bucket{pool="realtime",le="+Inf"} 3',
            'laneway_gateway_reclaim_seconds_count{pool="realtime"} 3',
            'laneway_gateway_reclaim_seconds_sum{pool="realtime"} 0.07',
            "# TYPE laneway_gateway_reclaimed_requests counter",
            'laneway_gateway_reclaimed_requests_total{endpoint="http://a"} 4',
            "# TYPE laneway_gateway_recomputed_prompt_tokens counter",
            'laneway_gateway_recomputed_prompt_tokens_total{pool="batch"} 1200',
        ]
    )
    reading = read_gateway(text + "\n")
    assert reading.reclaims_s == ((0.02, 2), (0.05, 1))
    assert (reading.reclaimed_requests, reading.recomputed_tokens) == (4, 1200)
    config = next(
        c for c in day_configs(QUICK_LIVE, PROFILES["h200-llama3-8b"]) if c.name == "lending"
    )
    sample = role_sample(config, 1.0, reading.roles)
    # Of the lender's 3: one lent (batch's now, beside its own 1), one draining, one serving.
    assert (sample.chat, sample.batch, sample.draining) == (1, 2, 1)
