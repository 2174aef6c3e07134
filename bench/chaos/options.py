"""`laneway bench chaos`'s options, the names of its windows, faults and verdicts."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from laneway.bench.demo.run import DEMO_POOLS
from laneway.errors import UsageError

BEFORE, ENGINE, REDIS, GATEWAY, AFTER = "before", "engine", "redis", "gateway", "after"
WINDOWS = (BEFORE, ENGINE, REDIS, GATEWAY, AFTER)
FAULTS = (ENGINE, REDIS, GATEWAY)
CHAT, DOCUMENT = "chat", "document"
REPLICAS = ("a", "b")
KILLED_REPLICA = "b"

OK = "ok"
IN_FLIGHT = "in flight on killed"  # + the fault: "in flight on killed gateway"
UNEXPECTED = "unexpected"

# What the engine's death looks like to a stream it was serving: the gateway ends it with
# this error event (laneway.gateway.serving.relay), or, before the first byte, answers 502.
ENGINE_GONE_CODES = ("upstream_failed", "upstream_unreachable")

# The default batch size: the batch must still be running when the last fault strikes, so
# that the killed replica is running items. 8 items at once (2 replicas x BATCH_CONCURRENCY),
# 256 output tokens each, go at about this rate on a small machine.
BATCH_ITEMS_PER_SECOND = 2.5
BATCH_CONCURRENCY = 4  # per replica

Say = Callable[[str], None]


@dataclass(frozen=True)
class ChaosOptions:
    duration_s: float = 60.0  # wall seconds of load; the faults strike within it
    sessions: int = 8  # closed-loop chat sessions
    documents: int = 2  # closed-loop long-document senders
    batch_items: int | None = None  # default: BATCH_ITEMS_PER_SECOND x duration
    outage_s: float = 3.0  # how long each killed process stays down
    engine_pool: str | None = None  # the pool whose busiest engine is killed; None: any
    batch_lease_s: float = 5.0  # the replicas' --batch-lease: reclaim after this silence
    settle_s: float = 180.0  # patience, after the load, for the batch and the held state
    seed: int = 0

    @property
    def items(self) -> int:
        if self.batch_items is not None:
            return self.batch_items
        return max(1, math.ceil(self.duration_s * BATCH_ITEMS_PER_SECOND))


QUICK = ChaosOptions(
    duration_s=20.0, sessions=3, documents=1, batch_items=30, outage_s=1.5, settle_s=90.0
)


def check_options(options: ChaosOptions) -> None:
    """UsageError naming the flag when the options cannot work."""
    window = options.duration_s / len(WINDOWS)
    if options.duration_s <= 0:
        raise UsageError(f"--duration must be above 0 seconds, got {options.duration_s:g}")
    if not 0 < options.outage_s < window:
        raise UsageError(
            f"--outage must be above 0 and shorter than one window ({window:g} s, a fifth "
            f"of --duration), got {options.outage_s:g}"
        )
    if options.sessions < 1 or options.documents < 0:
        raise UsageError("--sessions must be at least 1 and --documents at least 0")
    if options.items < 1:
        raise UsageError(f"--batch-items must be at least 1, got {options.items}")
    pools = [pool.name for pool in DEMO_POOLS]
    if options.engine_pool is not None and options.engine_pool not in pools:
        raise UsageError(f"--kill-engine-in must be one of {', '.join(pools)}")
    if options.batch_lease_s <= 0 or options.settle_s <= 0:
        raise UsageError("--batch-lease and --settle must be above 0 seconds")
