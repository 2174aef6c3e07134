"""`laneway bench redis`: a tiny run prints the table and writes the JSON; bad flags exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from laneway.bench.harness.procs import laneway_argv


def test_a_tiny_run_compares_both_backends(tmp_path: Path) -> None:
    out = tmp_path / "redis.json"
    args = ["redis", "--concurrency", "1,4", "--requests", "8", "--state-ops", "20"]
    done = subprocess.run(
        laneway_argv("bench", *args, "--json", str(out)),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split()[:3] == ["measured", "concurrency", "requests"]
    rows = [line.split() for line in lines[2:6]]
    assert [(row[0], row[1]) for row in rows] == [
        ("gateway", "1"),
        ("gateway", "4"),
        ("state", "ops"),
        ("state", "ops"),
    ]
    report = json.loads(out.read_text())
    assert [(c["what"], c["concurrency"]) for c in report["comparisons"]] == [
        ("gateway", 1),
        ("gateway", 4),
        ("state ops", 1),
        ("state ops", 4),
    ]
    for comparison in report["comparisons"]:
        assert comparison["errors"] == 0
        assert comparison["memory"]["count"] == comparison["redis"]["count"] > 0
    assert "starting a throwaway redis-server" in done.stderr  # progress goes to stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "1,x"], "--concurrency must be comma-separated integers"),
        (["--concurrency", "0"], "--concurrency needs one or more positive integers"),
        (["--state-ops", "0"], "--state-ops must be at least 1"),
        (["--redis-url", "http://x"], "must start with redis://"),
        (["--json", "/no/such/folder/x.json"], "--json: the folder of"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(flags: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "laneway.cli", "bench", "redis", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
