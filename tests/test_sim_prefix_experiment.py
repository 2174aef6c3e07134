"""The prefix experiment's virtual cluster: affinity raises hits and cuts prefill work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laneway.cli import main
from laneway.routing.picker import PickingSettings
from laneway.simulator.prefix_experiment import PrefixScenario, run_prefix
from laneway.simulator.profiles import PROFILES

SMALL = PrefixScenario(
    interactive_replicas=3, batch_replicas=2, chat_sessions=24, document_sessions=3,
    document_tokens=8192, duration_s=10.0,
)  # fmt: skip


def test_affinity_and_stickiness_hit_more_than_no_affinity() -> None:
    results = {
        picker: run_prefix(SMALL, PROFILES["h200-llama3-8b"], picker, PickingSettings())
        for picker in ("none", "laneway", "sticky")
    }
    none, laneway, sticky = results["none"], results["laneway"], results["sticky"]
    assert none.requests > 50
    assert laneway.requests > 50
    assert laneway.hit_rate > none.hit_rate
    assert sticky.hit_rate > none.hit_rate
    assert laneway.prefill_tokens < none.prefill_tokens
    assert all(0 < r.hit_rate < 1 and r.load_imbalance >= 1 for r in results.values())


def test_documents_spread_over_the_batch_replicas_with_affinity_on() -> None:
    # Four documents on two replicas: enough sessions that the imbalance measures the
    # picker. Before prefixAffinity scored relative to the largest backlog, seed 2 kept
    # new documents on a busy replica (1.44) while none balanced it (1.05).
    for seed in range(6):
        scenario = PrefixScenario(chat_sessions=0, document_sessions=4, document_tokens=8192,
                                  duration_s=30.0, seed=seed)  # fmt: skip
        result = run_prefix(scenario, PROFILES["h200-llama3-8b"], "laneway", PickingSettings())
        assert dict(result.pool_imbalance)["documents"] <= 1.3, seed


def test_bench_prefix_without_chat_reports_no_ttft(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prefix.json"
    args = ["bench", "prefix", "--chat-sessions", "0", "--document-sessions", "2",
            "--document-tokens", "1024", "--duration", "5", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    pickers = json.loads(out.read_text())["pickers"]
    assert pickers["laneway"]["interactive"]["ttft_ms"] == {"p50": None, "p99": None}
    assert pickers["laneway"]["requests"] > 0
    assert "laneway " in capsys.readouterr().out
