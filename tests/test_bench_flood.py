"""`laneway bench chaos --flood`: the goal's arithmetic, live (segments pooled against the
alone ones and each round's own ratio, a token cap's beside the uncapped flood) and virtual
(seeds paired with their unloaded runs), both pure; the flags that cannot work; a --quick run
of each mode in which the flooding tenant is held to its share (live: and its token cap, as
the gateways' shared counts have it) and the other tenant loses no request."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from laneway.bench.chaos import flood_virtual
from laneway.bench.chaos.flood import (
    WARMUP,
    FloodOptions,
    Peak,
    Sent,
    report_of,
    segments_of,
    tenants_file,
)
from laneway.cli import main
from laneway.simulator.flood_experiment import FloodResult, FloodScenario

ALONE, SHARE, TEN, CAPPED, REFUSED = "alone", "1x", "10x", "10x, cap 4,000", "10x, refused"
CAPPED_OPTIONS = FloodOptions(max_prompt_tokens=(4000,))


def steady(segment: str, ttft_s: float, status: int = 200, round_: int = 0) -> Sent:
    return Sent("steady", segment, status, ttft_s if status == 200 else None, None, round_)


def test_the_live_segments_and_tenants_follow_the_scenario() -> None:
    options = FloodOptions(
        scenario=FloodScenario(flood_share=3, flood_queue=5, flood_factor=10.0),
        max_prompt_tokens=(4000, 8000),
    )
    labels = [segment.label for segment in segments_of(options)]
    assert labels == [ALONE, SHARE, TEN, CAPPED, "10x, cap 8,000"]
    tenants = {entry["name"]: entry for entry in tenants_file(options)["tenants"]}
    assert list(tenants) == ["steady", "flood", "flood-4000", "flood-8000"]
    assert tenants["steady"].keys() == {"name", "apiKeys"}  # no caps
    assert tenants["flood-4000"]["maxConcurrentPromptTokens"] == 4000
    assert "maxConcurrentPromptTokens" not in tenants["flood"]
    assert {t["maxConcurrentRequests"] for t in list(tenants.values())[1:]} == {3}
    assert {t["maxQueuedRequests"] for t in list(tenants.values())[1:]} == {5}
    # A flood at its share is not sent twice.
    assert len(segments_of(FloodOptions(scenario=FloodScenario(flood_factor=1.0)))) == 2


def test_the_control_floods_from_a_tenant_refused_at_the_gateway_and_is_not_judged() -> None:
    options = FloodOptions(max_prompt_tokens=(4000,), control=True)
    assert [segment.label for segment in segments_of(options)][-2:] == [CAPPED, REFUSED]
    tenants = {entry["name"]: entry for entry in tenants_file(options)["tenants"]}
    # A per-minute allowance of 1 token: every flood request needs more, so each is refused.
    assert tenants["flood-refused"]["tokensPerMinute"] == 1
    assert "tokensPerMinute" not in tenants["flood"]
    assert "tokensPerMinute" not in tenants["flood-4000"]
    sent = [steady(ALONE, 0.1) for _ in range(20)]
    sent += [steady(SHARE, 0.3) for _ in range(20)]
    sent += [steady(TEN, 0.3) for _ in range(20)]
    sent += [steady(CAPPED, 0.2) for _ in range(20)]
    # The control is closest to alone, yet it says what the machine costs, not a design.
    sent += [steady(REFUSED, 0.105) for _ in range(20)]
    sent += [Sent("flood-refused", REFUSED, 429, None, "tokens_exceed_limit")]
    report = report_of("cmd", options, sent, {})
    by_label = {row.segment: row for row in report.segments}
    control = by_label[REFUSED]
    assert control.ratio_alone is not None
    assert control.ratio_alone[0] == pytest.approx(1.05)
    assert (control.flood_ok, control.flood_refused) == (0, 1)
    assert report.goal_segment == CAPPED
    assert report.goal_ratio == pytest.approx(2.0)
    assert not report.goal_met


@pytest.mark.parametrize(
    ("case", "flood_ttft_s", "refused", "met"),
    [
        ("within 10 % and nothing refused", 0.105, 0, True),
        ("past 10 %", 0.115, 0, False),
        ("one steady request refused", 0.1, 1, False),
    ],
)
def test_the_goal_is_the_flood_over_the_alone_segments_and_no_refusal(
    case: str, flood_ttft_s: float, refused: int, met: bool
) -> None:
    sent = [steady(WARMUP, 9.0)]  # a cold start: not counted
    sent += [steady(ALONE, 0.1) for _ in range(20)]
    sent += [steady(SHARE, 0.1) for _ in range(20)]
    sent += [steady(TEN, flood_ttft_s) for _ in range(20)]
    sent += [steady(TEN, 0.0, status=429) for _ in range(refused)]
    sent += [Sent("flood", TEN, 429, None, "tenant_queue_full")]
    report = report_of("cmd", FloodOptions(), sent, {TEN: Peak(running=4)})
    alone, _, ten = report.segments
    assert ten.ratio_alone is not None
    assert ten.ratio_alone[0] == pytest.approx(flood_ttft_s / 0.1)
    assert report.goal_ratio == pytest.approx(flood_ttft_s / 0.1)
    assert report.goal_segment == TEN
    assert report.goal_met is met
    assert [h.flood_refused for h in report.segments] == [0, 0, 1]
    assert (alone.flood_peak, ten.flood_peak) == (Peak(), Peak(running=4))


def test_each_round_is_its_flood_segment_over_its_own_alone_one() -> None:
    # Round 0 ran on a quiet machine, round 1 on a busy one, twice as slow throughout.
    sent = []
    for round_, alone_s, flood_s in ((0, 0.1, 0.11), (1, 0.2, 0.2), (2, 0.1, 0.13)):
        sent += [steady(ALONE, alone_s, round_=round_) for _ in range(20)]
        sent += [steady(SHARE, alone_s, round_=round_) for _ in range(20)]
        sent += [steady(TEN, flood_s, round_=round_) for _ in range(20)]
    report = report_of("cmd", FloodOptions(), sent, {})
    ten = report.segments[2]
    assert ten.ratio_alone is not None
    pooled, *rounds = ten.ratio_alone
    assert rounds == pytest.approx([1.1, 1.0, 1.3])
    # Pooled, the busy round's alone segment sets both P99s.
    assert pooled == pytest.approx(1.0)


def test_a_token_capped_segment_is_judged_beside_the_uncapped_flood() -> None:
    sent = [steady(ALONE, 0.1) for _ in range(20)]
    sent += [steady(SHARE, 0.3) for _ in range(20)]
    sent += [steady(TEN, 0.3) for _ in range(20)]
    sent += [steady(CAPPED, 0.105) for _ in range(20)]
    sent += [Sent("flood", CAPPED, 200, 0.5, None)]  # another tenant's: not this segment's
    sent += [
        Sent("flood-4000", CAPPED, 200, 0.5, None),
        Sent("flood-4000", CAPPED, 429, None, None),
    ]
    report = report_of("cmd", CAPPED_OPTIONS, sent, {})
    by_label = {row.segment: row for row in report.segments}
    capped = by_label[CAPPED]
    assert capped.ratio_uncapped is not None
    assert capped.ratio_share is not None
    assert capped.ratio_uncapped[0] == pytest.approx(0.35)
    assert capped.ratio_share[0] == pytest.approx(0.35)
    assert by_label[TEN].ratio_uncapped is None
    assert (capped.flood_ok, capped.flood_refused) == (1, 1)
    # Uncapped the flood misses the goal; with the cap it meets it, and the run does.
    assert report.goal_segment == CAPPED
    assert report.goal_ratio == pytest.approx(1.05)
    assert report.goal_met


def flooded(
    factor: float,
    seed: int,
    ttft_s: float,
    queue: int = 8,
    refused: int = 0,
    cap: int | None = None,
    tokens: int = 30_000,
) -> FloodResult:
    scenario = FloodScenario(
        flood_factor=factor, flood_queue=queue, seed=seed, flood_max_prompt_tokens=cap
    )
    return FloodResult(
        scenario=scenario,
        steady_ttft_s=(ttft_s,) * 50,
        steady_refused=refused,
        flood_ok=10,
        flood_prompt_tokens=0 if factor == 0 else tokens,
        flood_refused=0 if factor <= 1 else 5,
        flood_peak_running=0 if factor == 0 else 4,
    )


def test_virtual_rows_pair_each_seed_with_its_own_unloaded_run() -> None:
    alone = [flooded(0, 0, 0.020), flooded(0, 1, 0.040)]
    share = [flooded(1, 0, 0.021), flooded(1, 1, 0.042)]
    runs = [flooded(10, 0, 0.021), flooded(10, 1, 0.048), flooded(20, 0, 0.030, refused=1)]
    rows = flood_virtual.sweep_rows(alone, share, runs)
    by_factor = {row.flood_factor: row for row in rows}
    assert list(by_factor) == [0.0, 1.0, 10.0, 20.0]
    ten = by_factor[10.0]
    # Seed 1 is slower alone too: paired, its flood costs 20 %, seed 0's 5 %.
    assert ten.ratio_alone == pytest.approx((1.125, 1.05, 1.2))
    assert ten.ratio_share == pytest.approx((1.071, 1.0, 1.143), abs=1e-3)
    assert ten.steady_ttft_p99_ms == pytest.approx(34.5)
    assert (ten.flood_queue, ten.flood_refused, ten.flood_peak_running) == (8, 10, 4)
    assert by_factor[0.0].ratio_alone == (1.0, 1.0, 1.0)
    options = flood_virtual.VirtualFloodOptions()
    report = flood_virtual.report_of("cmd", options, rows)
    assert report.goal_ratio == pytest.approx(1.125)
    assert not report.goal_met  # past 10 %, and a steady request refused at 20x
    within = flood_virtual.sweep_rows(alone, share, runs[:1])
    assert flood_virtual.report_of("cmd", options, within).goal_met


def test_token_capped_rows_pair_each_run_with_its_uncapped_one() -> None:
    alone = [flooded(0, 0, 0.020), flooded(0, 1, 0.040)]
    share = [flooded(1, 0, 0.021), flooded(1, 1, 0.042)]
    runs = [
        flooded(10, 0, 0.060),
        flooded(10, 1, 0.120),
        flooded(10, 0, 0.021, cap=4000, tokens=12_000),
        flooded(10, 1, 0.044, cap=4000, tokens=15_000),
    ]
    rows = flood_virtual.sweep_rows(alone, share, runs)
    by_cap = {row.flood_max_prompt_tokens: row for row in rows if row.flood_factor == 10}
    capped, uncapped = by_cap[4000], by_cap[None]
    # Seed 0's P99 falls from 60 to 21 ms with the cap, seed 1's from 120 to 44.
    assert capped.ratio_uncapped == pytest.approx((0.358, 0.35, 0.367), abs=1e-3)
    assert capped.ratio_alone == pytest.approx((1.075, 1.05, 1.1))
    # What it costs the flood: 40 % and 50 % of its prompt tokens served.
    assert capped.flood_tokens_uncapped == pytest.approx((0.45, 0.4, 0.5))
    assert capped.flood_prompt_tokens == 27_000
    assert uncapped.ratio_uncapped == uncapped.flood_tokens_uncapped == (1.0, 1.0, 1.0)
    options = flood_virtual.VirtualFloodOptions(max_prompt_tokens=(4000,))
    report = flood_virtual.report_of("cmd", options, rows)
    assert dict(report.goal_ratios) == pytest.approx({None: 3.0, 4000: 1.075})
    assert report.goal_ratio == pytest.approx(1.075)
    assert report.goal_cap == 4000
    assert report.goal_met  # with the cap: within 10 % of alone, in the median seed
    lines = flood_virtual.render(report)
    assert "token cap" in lines[3]
    assert "goal met" in lines[-1]


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--flood-queue", "0"], "--flood-queue"),
        (["--flood-factors", "10,x"], "--flood-factors"),
        (["--flood-share", "0"], "--flood-share"),
        (["--rounds", "0"], "--rounds"),
        (["--flood-prompt-tokens", "800,200"], "--flood-prompt-tokens"),
        (["--mode", "live", "--flood-factors", "2,10"], "--flood-factors"),
        (["--pool-slots", "0"], "--pool-slots"),
        (["--flood-max-prompt-tokens", "4000,0"], "--flood-max-prompt-tokens"),
        (["--mode", "live", "--flood-max-prompt-tokens", "0"], "--flood-max-prompt-tokens"),
        (["--mode", "live", "--pool-slots", "3"], "--pool-slots"),
        (["--flood-control"], "--flood-control"),
    ],
)
def test_flood_flags_that_cannot_work_name_themselves(
    args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "chaos", "--flood", *args]) == 2
    assert flag in capsys.readouterr().err


def test_the_flood_flags_go_with_flood_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "chaos", "--mode", "virtual"]) == 2
    assert "--mode goes with --flood" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_a_quick_virtual_flood_holds_the_flood_to_its_share(tmp_path: Path) -> None:
    out = tmp_path / "flood.json"
    code = main(["bench", "chaos", "--flood", "--quick", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == (0 if report["goal_met"] else 1)
    alone, share, ten = report["rows"]
    assert [alone["flood_factor"], share["flood_factor"], ten["flood_factor"]] == [0, 1, 10]
    assert alone["flood_peak_running"] == 0
    assert share["flood_peak_running"] == ten["flood_peak_running"] == 4
    assert share["flood_refused"] == 0 < ten["flood_refused"]
    assert sum(row["steady_refused"] for row in report["rows"]) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_quick_flood_run_keeps_the_flood_to_its_share_and_its_token_cap(
    tmp_path: Path,
) -> None:
    out = tmp_path / "flood.json"
    args = ["bench", "chaos", "--flood", "--mode", "live", "--quick", "--rounds", "1"]
    # Long prompts, against a cap that one of them fills (each replica keeps to half of it).
    args += ["--flood-prompt-tokens", "2000,4000", "--flood-max-prompt-tokens", "4000"]
    args += ["--flood-control"]
    done = subprocess.run(
        [sys.executable, "-P", "-m", "laneway.cli", *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    report = json.loads(out.read_text())
    assert done.returncode == (0 if report["goal_met"] else 1), done.stderr
    alone, share, ten, capped, control = report["segments"]
    labels = [segment["segment"] for segment in report["segments"]]
    assert labels == [ALONE, SHARE, TEN, CAPPED, REFUSED]
    # Timing is the machine's; the counts are the gateway's: the steady tenant lost nothing,
    # the flood tenant was refused by its own caps only once it flooded.
    for segment in report["segments"]:
        assert segment["steady_refused"] == 0, report
        assert segment["steady_ok"] > 0, report
    assert alone["flood_ok"] == alone["flood_refused"] == 0, report
    assert share["flood_refused"] == 0 < ten["flood_refused"], report
    # As the gateways' shared counts had it: uncapped, the flood ran its share of 4 long
    # prompts; capped, one at a time over both replicas (each past the cap, so each ran
    # alone, under the tenant's lease), the rest waited in line or were refused.
    assert ten["flood_peak"]["running"] == 4, report
    assert capped["flood_peak"]["running"] == 1, report
    # One prompt of up to 4,000 tokens and its few of chat framing.
    assert 2000 <= capped["flood_peak"]["running_prompt_tokens"] <= 4100, report
    assert capped["flood_ok"] > 0, report
    assert capped["flood_refused"] > 0, report
    # The control's flood reached no engine: each of its requests refused at the gateway.
    assert control["flood_ok"] == 0 < control["flood_refused"], report
    assert control["flood_peak"]["running"] == 0, report
