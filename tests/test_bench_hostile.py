"""`laneway bench hostile` runs end to end and every hostile body gets a 4xx; the hostile
tenant's batch completes, its slow bodies get 408, each engine-control field a 400 naming
it, and its `"priority": -1000` does not jump the other tenant's queued request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_hostile_reports_every_phase_and_only_4xx(tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    args = ["bench", "hostile", "--seconds", "0.5", "--senders", "1", "--batch-lines", "300"]
    args += ["--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "laneway.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "p99/quiet" in done.stdout
    report = json.loads(out.read_text())
    names = [phase["name"] for phase in report["phases"]]
    assert names[0] == "quiet"
    assert len(names) == 8
    assert names[-1] == "kv_transfer_params x1"
    for phase in report["phases"][1:]:
        assert phase["hostile_sent"] >= 1, phase
        assert all(400 <= int(status) < 500 for status in phase["statuses"]), phase
    tenant = report["tenant"]
    batch = tenant["batch"]
    assert (batch["create_status"], batch["status"]) == (200, "completed"), batch
    assert (batch["completed"], batch["failed"]) == (300, 0)
    for process in ("rss_mb", "redis_rss_mb"):  # the gateway's memory and its Redis's
        assert 0 < batch[f"{process}_before"] <= batch[f"{process}_peak"], batch
    assert tenant["slow_bodies"] == {"408": 10}
    assert tenant["slow_answer_s"] < 10  # the 2 s deadline, not the trickle's pace
    fields = {case: status for case, status in tenant["small_ones"].items() if "field" in case}
    assert "body field kv_transfer_params" in fields
    assert set(fields.values()) == {"400"}, fields  # and each 400 named its field
    assert all(400 <= int(status) < 500 for status in tenant["small_ones"].values()), tenant
    priority = tenant["priority"]
    assert priority["statuses"] == {"victim": 200, "hostile": 200}, priority
    assert priority["order"] == ["victim", "hostile"], priority
    assert "300-line batch" in done.stdout
    assert "Redis RSS:" in done.stdout
    assert report["server_errors"] == 0
    assert report["tracebacks"] == {"bodies gateway": 0, "tenant gateway": 0}
    assert "tracebacks logged: bodies gateway 0, tenant gateway 0" in done.stdout
