"""The prefix experiment's virtual cluster: affinity raises hits and cuts prefill work."""

from __future__ import annotations

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
