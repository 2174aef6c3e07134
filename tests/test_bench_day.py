"""`laneway bench day --quick`, briefly: the table has one row per configuration, the JSON
holds each one's figures, and they keep the day's invariants (every replica in one role at
every moment; lending never below keepReplicas for chat nor below the borrower's own
replicas for batch; only lending reclaims)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laneway.bench.day.cli import CONFIG_NAMES
from laneway.cli import main
from laneway.simulator.day import DayScenario

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


def test_bad_flags_are_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "day", "--peak", "10", "--trough", "20", "--configs", "x"]) == 2
    err = capsys.readouterr().err
    assert "--trough must be between 0 and --peak" in err
    assert "--configs: unknown x" in err
