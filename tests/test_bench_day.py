"""`laneway bench day --quick`, briefly: the table has one row per configuration, the JSON
holds each one's figures, and they keep the day's invariants (every replica in one role at
every moment; lending never below keepReplicas for chat nor below the borrower's own
replicas for batch; only lending reclaims)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laneway.bench.day.cli import CONFIG_NAMES, QUICK, scenario_from
from laneway.cli import build_parser, main
from laneway.simulator.day import DOCUMENTS, DayScenario, DayWorkload, day_configs
from laneway.simulator.profiles import PROFILES
from laneway.simulator.runner import VirtualCluster

GPUS, BATCH_OWN = 8, 3  # the lending configuration's borrower keeps 3 of its own


def test_quick_day_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "day.json"
    # A trough long enough for lending to lend (one replica per 5 s of lull), then a peak.
    argv = ["bench", "day", "--quick", "--day", "16", "--documents", "24", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(printed) if line.startswith("config"))
    rows = [line.split()[0] for line in printed[header + 2 :] if line.strip()]
    assert rows == list(CONFIG_NAMES)
    document = json.loads(out.read_text())
    configs = {c["name"]: c for c in document["configs"]}
    assert list(configs) == list(CONFIG_NAMES)
    for name, c in configs.items():
        assert 0 <= c["turns_in_slo"] <= c["turns_completed"] <= c["turns_started"], name
        assert 0 <= c["documents_completed"] <= 24, name
        assert c["document_tokens_prefilled"] >= c["documents_completed"] * 32768, name
        assert 0 < c["gpu_busy"] <= 1, name
        assert 0 <= c["recomputed_share"] < 1, name
        for sample in c["roles"]:
            assert sample["chat"] + sample["batch"] + sample["draining"] == GPUS, name
        if name != "lending":
            assert c["reclaims"] == 0, name
            assert len({(s["chat"], s["batch"]) for s in c["roles"]}) == 1, name  # fixed
    lending = configs["lending"]
    assert all(s["chat"] >= 1 and s["batch"] >= BATCH_OWN for s in lending["roles"])
    assert max(s["batch"] for s in lending["roles"]) > BATCH_OWN  # it did lend
    # The same engines in a fixed 5+3 split never take more than their own 3 for batch.
    assert {s["batch"] for s in configs["fixed-5+3"]["roles"]} == {BATCH_OWN}
    assert configs["fixed-5+3"]["turns_completed"] > 0


def test_the_day_ramps_from_the_trough_to_the_peak_and_back() -> None:
    day = DayScenario(trough_sessions=50, peak_sessions=300, day_s=100)
    assert [day.sessions_at(t) for t in (0, 20, 40, 50, 60, 80, 100)] == [
        50, 175, 300, 300, 300, 175, 50,
    ]  # fmt: skip


def test_a_steeper_ramp_keeps_its_centres_and_the_day_s_chat() -> None:
    steep = DayScenario(trough_sessions=50, peak_sessions=300, day_s=100, ramp=0.2)
    assert [steep.sessions_at(t) for t in (0, 10, 20, 30, 50, 70, 80, 90, 100)] == [
        50, 50, 175, 300, 300, 300, 175, 50, 50,
    ]  # fmt: skip
    default = DayScenario(trough_sessions=50, peak_sessions=300, day_s=100)
    session_seconds = [sum(d.sessions_at(t / 10) for t in range(1000)) for d in (default, steep)]
    assert abs(session_seconds[0] - session_seconds[1]) <= 1


def test_sweep_flags_reach_the_scenario() -> None:
    args = build_parser().parse_args(
        ["bench", "day", "--quick", "--doc-tokens", "65536-131000", "--ramp", "0.2"]
    )
    scenario = scenario_from(args)
    assert (scenario.document_tokens, scenario.ramp) == ((65536, 131000), 0.2)
    assert scenario.peak_sessions == QUICK.peak_sessions  # the preset's, the rest untouched
    default = scenario_from(build_parser().parse_args(["bench", "day"]))
    assert (default.document_tokens, default.ramp) == ((32768, 65536), 0.4)


def test_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "day", "--help"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert "centred at 20 and 80 % of the day" in printed
    assert "--stream-documents" in printed


def test_bad_flags_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "day", "--peak", "10", "--trough", "20", "--configs", "x"]
    assert main([*argv, "--doc-tokens", "65536-131072", "--ramp", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--trough must be between 0 and --peak" in err
    assert "--configs: unknown x" in err
    assert "--doc-tokens 65536-131072: MIN-MAX must lie within 2049-130816" in err
    assert "--ramp must be above 0 and at most 0.4" in err
    assert main(["bench", "day", "--doc-tokens", "65536-32768"]) == 2
    assert "MIN at most MAX" in capsys.readouterr().err
    assert main(["bench", "day", "--ramp", "0"]) == 2
    assert "--ramp must be above 0" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["64k", "32768", "1-2-3", "-5-10", "a-b"])
def test_doc_tokens_must_be_two_numbers(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "day", f"--doc-tokens={text}"]) == 2
    assert "--doc-tokens must be MIN-MAX, two whole numbers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "document_level", "chat_level"),
    [("unified-priority", 1, 0), ("unified-chunked", None, None)],
)
def test_documents_reach_a_priority_scheduled_engine_behind_chat(
    name: str, document_level: int | None, chat_level: int | None
) -> None:
    """As the gateway sends them: a pool scheduling by priority gets the documents' level 1
    (their objective's -1) and chat's 0; an FCFS pool gets no priority at all."""
    scenario = DayScenario(peak_sessions=4, documents=3, day_s=10)
    profile = PROFILES["h200-llama3-8b"]
    config = next(c for c in day_configs(scenario, profile) if c.name == name)
    workload = DayWorkload(scenario)
    cluster = VirtualCluster(
        config.pools, profile, config.picking, workload,
        duration_s=scenario.day_s, tie_break="t", scrape_interval_s=None,
    )  # fmt: skip
    workload.on_event(cluster, 0.0, DOCUMENTS)
    workload.on_event(cluster, 0.0, 0)  # session 0's first turn
    sent = sorted(cluster.requests.values(), key=lambda r: r.source)  # chat's session 0 last
    assert [r.engine_priority for r in sent] == [document_level] * 3 + [chat_level]
    # The engines hold them at those levels (vLLM's default 0 where none is sent).
    held = {
        seq.request_id: seq.priority
        for replica in cluster.replicas
        for seq in (*replica.core.running, *replica.core.waiting)
    }
    assert [held[r.request_id] for r in sent] == [document_level or 0] * 3 + [chat_level or 0]
