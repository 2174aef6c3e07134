"""`laneway bench chaos --flood`: the goal's arithmetic (pure) and a --quick run in which
the flooding tenant is held to its share and the other tenant loses no request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from laneway.bench.chaos.flood import BASELINE, FLOOD, WARMUP, FloodOptions, Sent, report_of


def steady(segment: str, ttft_s: float, status: int = 200) -> Sent:
    return Sent("steady", segment, status, ttft_s if status == 200 else None, None)


@pytest.mark.parametrize(
    ("case", "flood_ttft_s", "refused", "met"),
    [
        ("within 10 % and nothing refused", 0.105, 0, True),
        ("past 10 %", 0.115, 0, False),
        ("one steady request refused", 0.1, 1, False),
    ],
)
def test_the_goal_is_the_ratio_of_the_two_kinds_of_segment_and_no_refusal(
    case: str, flood_ttft_s: float, refused: int, met: bool
) -> None:
    sent = [steady(WARMUP, 9.0)]  # a cold start: not counted
    sent += [steady(BASELINE, 0.1) for _ in range(20)]
    sent += [steady(FLOOD, flood_ttft_s) for _ in range(20)]
    sent += [steady(FLOOD, 0.0, status=429) for _ in range(refused)]
    sent += [Sent("flood", FLOOD, 429, None, "tenant_queue_full")]
    report = report_of("cmd", FloodOptions(), sent)
    assert report.ttft_p99_ratio == pytest.approx(flood_ttft_s / 0.1)
    assert report.goal_met is met
    assert [h.flood_refused for h in report.segments] == [0, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_quick_flood_run_keeps_the_flood_to_its_share(tmp_path: Path) -> None:
    out = tmp_path / "flood.json"
    args = ["bench", "chaos", "--flood", "--quick", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "laneway.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = json.loads(out.read_text())
    assert done.returncode == (0 if report["goal_met"] else 1), done.stderr
    baseline, flood = report["segments"]
    # Timing is the machine's; the counts are the gateway's: the steady tenant lost nothing,
    # the flood tenant was refused by its own caps only once it flooded.
    assert baseline["steady_refused"] == flood["steady_refused"] == 0, report
    assert baseline["steady_ok"] > 0, report
    assert flood["steady_ok"] > 0, report
    assert baseline["flood_refused"] == 0, report
    assert flood["flood_refused"] > 0, report
