"""One request trace through the ledger as the virtual runner drives it: the decisions and
logs a gateway fed the same trace must reproduce.

`run_trace` replays arrivals (`elastic.Arrival`: when, prompt and output tokens, a pinned
lane) on simulated pools with a `RecordingLedger`, and returns it: its `steps` are every
answer the runner got (admissions, plans, attempts, first tokens, finished logs), its
`decisions()` the same without times. A gateway test drives a `RecordingLedger` of its own
with the same pools, picking settings and generator seed, sends the same requests, and
compares `decisions()` (mapping the runner's endpoint names to its engines' URLs).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from laneway.ledger.recording import RecordingLedger
from laneway.routing.picker import PickingSettings
from laneway.simulator.elastic import Arrival, TraceWorkload
from laneway.simulator.profiles import Profile
from laneway.simulator.runner import VirtualCluster, ledger_settings
from laneway.simulator.seed import SimPool


def run_trace(
    pools: Sequence[SimPool],
    arrivals: Sequence[Arrival],
    profile: Profile,
    picking: PickingSettings,
    *,
    tie_break: str = "trace",
    scrape_interval_s: float | None = None,
) -> tuple[RecordingLedger, VirtualCluster]:
    """Run the trace to its end; the ledger that recorded it and the cluster that ran it."""
    ledger = RecordingLedger(ledger_settings(picking, scrape_interval_s), random.Random(tie_break))
    end_s = max((arrival.at_s for arrival in arrivals), default=0.0)
    cluster = VirtualCluster(
        pools,
        profile,
        picking,
        TraceWorkload(arrivals),
        duration_s=end_s,
        tie_break=tie_break,
        scrape_interval_s=scrape_interval_s,
        ledger=ledger,
    )
    cluster.run()
    return ledger, cluster
